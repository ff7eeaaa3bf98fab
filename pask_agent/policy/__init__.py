"""KV policies: PASK and the baselines, all registered by name (STYLE rule 4).

Importing this package imports every policy module, so :data:`POLICIES` lists them all:
``full``, ``pask``, ``streaming``, ``h2o``, ``snapkv``, ``mikv`` and ``position``.
"""

from pask_agent.policy.base import Demotion, Policy, PolicyEnv, RetentionView
from pask_agent.policy.full import FullPolicy
from pask_agent.policy.h2o import H2OPolicy
from pask_agent.policy.mikv import MiKVPolicy
from pask_agent.policy.pask import HandWrittenPaskPolicy, PaskPolicy
from pask_agent.policy.position import PositionPolicy
from pask_agent.policy.registry import POLICIES, get_policy, register_policy
from pask_agent.policy.snapkv import SnapKVPolicy
from pask_agent.policy.streaming import StreamingPolicy

__all__ = [
    "POLICIES",
    "Demotion",
    "FullPolicy",
    "H2OPolicy",
    "HandWrittenPaskPolicy",
    "MiKVPolicy",
    "PaskPolicy",
    "Policy",
    "PolicyEnv",
    "PositionPolicy",
    "RetentionView",
    "SnapKVPolicy",
    "StreamingPolicy",
    "get_policy",
    "register_policy",
]
