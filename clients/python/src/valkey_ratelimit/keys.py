"""Keys for Valkey Cluster: the keys of one ``RL.ALL`` must share a slot."""

from __future__ import annotations


def same_slot(tag: str, *parts: str, prefix: str = "rl") -> list[str]:
    """Keys that hash to one slot: ``{tag}`` is the hash tag of each.

    ``same_slot("key:7f3a", "s", "d", "ip:203.0.113.9")`` gives
    ``["rl:{key:7f3a}:s", "rl:{key:7f3a}:d", "rl:{key:7f3a}:ip:203.0.113.9"]``.
    Braces in ``tag`` would end the hash tag early, so they are refused.
    """
    if not tag or "{" in tag or "}" in tag:
        raise ValueError(f"a hash tag must be non-empty and without braces: {tag!r}")
    return [f"{prefix}:{{{tag}}}:{part}" for part in parts]
