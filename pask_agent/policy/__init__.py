"""KV policies: PASK and the baselines, all registered by name (STYLE rule 4).

Importing this package imports every policy module, so :data:`POLICIES` lists them all:
``full``, ``pask``, ``pask_hand``, ``streaming``, ``h2o``, ``snapkv``, ``mikv``, ``position``,
``position_both``, ``int4``, ``pask_release``, and the INT4-store rankings ``snapkv_int4``,
``keydiff`` and ``rkv``.
"""

from pask_agent.policy.base import Demotion, Policy, PolicyEnv, RetentionView
from pask_agent.policy.full import FullPolicy
from pask_agent.policy.h2o import H2OPolicy
from pask_agent.policy.keydiff import KeyDiffPolicy
from pask_agent.policy.label_release import LabelReleasePolicy
from pask_agent.policy.mikv import MiKVPolicy
from pask_agent.policy.pask import HandWrittenPaskPolicy, PaskPolicy
from pask_agent.policy.position import PositionPolicy
from pask_agent.policy.position_both import PositionBothPolicy
from pask_agent.policy.registry import POLICIES, get_policy, register_policy
from pask_agent.policy.rkv import RKVPolicy
from pask_agent.policy.snapkv import SnapKVInt4Policy, SnapKVPolicy
from pask_agent.policy.streaming import StreamingPolicy
from pask_agent.policy.uniform import Int4Policy

__all__ = [
    "POLICIES",
    "Demotion",
    "FullPolicy",
    "H2OPolicy",
    "HandWrittenPaskPolicy",
    "Int4Policy",
    "KeyDiffPolicy",
    "LabelReleasePolicy",
    "MiKVPolicy",
    "PaskPolicy",
    "Policy",
    "PolicyEnv",
    "PositionBothPolicy",
    "PositionPolicy",
    "RKVPolicy",
    "RetentionView",
    "SnapKVInt4Policy",
    "SnapKVPolicy",
    "StreamingPolicy",
    "get_policy",
    "register_policy",
]
