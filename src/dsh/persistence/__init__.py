"""Persistence: the contract, the coordinator and the storage backends.

Layer: persistence (imports `dsh.session` and the base modules only).
"""
