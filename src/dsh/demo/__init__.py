"""The keyless demonstration behind `dsh demo`: real scripted agents, a restart and a damaged child.

`scenario.run_demo` drives the walkthrough (docs/demo.md); `script.json` is the packaged model
script it replays; `damage.remove_descriptor` damages a log on purpose; `home.prepare_home` checks
the home folder. Nothing here needs a key, the network or the `pydsh[testing]` extra.
"""
