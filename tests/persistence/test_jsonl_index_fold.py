"""Folding the parent index's updates into a new base gives exactly the file a whole re-encoding gives.

`IndexView.fold` is the fast path of an index rewrite (docs/storage-format.md#parent-index): it copies
or drops every base line as bytes, comparing the names the updates touched in their JSON spelling,
and counts the duplicate ids again from the lines. The rule it must keep is `encode_base` of
the whole state (every folder's entries after every update), which parses nothing and writes
everything; a differential property holds the first to the second on generated bases and updates.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.persistence.jsonl._index_format import (
    NAME,
    Entry,
    IndexView,
    Stamp,
    decode,
    encode_base,
    encode_update,
    extend,
)
from tests.helpers import examples

ARTIFACT = "session.jsonl.zstd"
FOLDERS = ["--a--", "--b--", '--q"t--', "_no-cwd", "--ü--"]
NAMES = ["s1", "s2", "s3", "x\ty", "é", "dup"]
IDS = ["s1", "s2", "s3", "dup", "other"]
PARENTS = [None, "P", "Q", "s1"]

entries = st.one_of(
    st.builds(
        lambda name, inode, session_id, parent, origin, at: ("L", name, inode, session_id, parent, origin, at),
        st.sampled_from(NAMES),
        st.integers(1, 10**12),
        st.sampled_from(IDS),
        st.sampled_from(PARENTS),
        st.sampled_from([None, "subagent"]),
        st.integers(0, 2**53),
    ),
    st.builds(
        lambda kind, name, inode: (kind, name, inode),
        st.sampled_from(["D", "R", "I"]),
        st.sampled_from(NAMES),
        st.integers(1, 10**12),
    ),
)
stamps = st.builds(Stamp, st.integers(1, 2**40), st.integers(0, 2**62), st.integers(0, 2**62))
folder_states = st.dictionaries(st.sampled_from(NAMES), entries, max_size=4).map(
    lambda named: {name: (entry[0], name, *entry[2:]) for name, entry in named.items()}
)
updates = st.tuples(
    st.sampled_from(FOLDERS),
    stamps,
    st.lists(entries, max_size=3),
    st.lists(st.sampled_from(NAMES), max_size=2),
    st.booleans(),
)


def _named(entry: Entry, name: str) -> Entry:
    return (entry[0], name, *entry[2:])


@settings(max_examples=examples(300), deadline=None)
@given(
    base=st.dictionaries(st.sampled_from(FOLDERS), st.tuples(stamps, folder_states), max_size=4),
    appended=st.lists(updates, max_size=6),
    change=st.tuples(st.sampled_from(FOLDERS), stamps, folder_states, st.booleans()),
    keep=st.one_of(st.none(), st.sets(st.sampled_from(FOLDERS))),
)
def test_folding_equals_encoding_the_whole_state(
    base: dict[str, tuple[Stamp, dict[str, Entry]]],
    appended: list[tuple[str, Stamp, list[Entry], list[str], bool]],
    change: tuple[str, Stamp, dict[str, Entry], bool],
    keep: set[str] | None,
) -> None:
    """A base, appended updates, then one more change (replacing a folder or not, keeping some folders).

    The view after the updates also lists every entry of the state (`full`), and the folded file
    decodes to the state after the change.
    """
    state: dict[str, dict[str, Entry]] = {folder: dict(named) for folder, (_, named) in base.items()}
    folder_stamps: dict[str, Stamp] = {folder: stamp for folder, (stamp, _) in base.items()}
    view = decode(encode_base(ARTIFACT, folder_stamps, state))
    assert view is not None
    for folder, stamp, changed, removed, replace in appended:
        line = encode_update(folder, stamp, changed, removed, [], replace=replace)
        view = extend(view, line)
        current = {} if replace else state.get(folder, {})
        for name in removed:
            current.pop(name, None)
        current.update((entry[NAME], entry) for entry in changed)
        state[folder] = current
        folder_stamps[folder] = stamp
    assert view.full() == {name: state.get(name, {}) for name in folder_stamps}  # the overlaid view, parsed
    folder, stamp, named, replace = change
    changes: dict[str, Any] = {folder: dict(named)}
    if not replace:
        # Removals too: a name of the folder's current entries that the change drops.
        for name in list(state.get(folder, {}))[:1]:
            changes[folder].setdefault(name, None)
    folder_stamps[folder] = stamp
    kept = None if keep is None else {*keep, folder}

    folded = view.fold(folder_stamps, changes, replaced=(folder,) if replace else (), keep=kept)

    after = {} if replace else dict(state.get(folder, {}))
    for name, entry in changes[folder].items():
        if entry is None:
            after.pop(name, None)
        else:
            after[name] = entry
    state[folder] = after
    if kept is not None:
        state = {name: value for name, value in state.items() if name in kept}
        folder_stamps = {name: value for name, value in folder_stamps.items() if name in kept}
    assert folded == encode_base(ARTIFACT, folder_stamps, state)
    refolded = decode(folded)
    assert isinstance(refolded, IndexView)
    assert refolded.full() == {name: state.get(name, {}) for name in folder_stamps}
