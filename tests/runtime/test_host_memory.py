"""Freed scratch memory stays in the process, so repeated CPU steps stop faulting pages in.

Each measurement runs in its own interpreter: the glibc setting is process-wide and cannot be
taken back. The control holds glibc's starting mmap threshold (128 KiB) fixed: left alone, glibc
raises that threshold by itself after some frees, at a moment that varies from run to run, so a
plain process faults on every step in one run and on none in the next (measured: 0 to 456,400
faults for the same 20 steps), which no assertion can compare against.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pask_agent.runtime.memory import host_memory

PROBE = """
import ctypes, resource, sys, torch
from pask_agent.runtime.memory.host_memory import retain_freed_host_memory
if sys.argv[1] == "retain":
    took = retain_freed_host_memory()
else:  # M_MMAP_THRESHOLD at glibc's default: every large block is mapped, then unmapped on free
    took = ctypes.CDLL(None).mallopt(-3, 128 * 1024) == 1

def step():  # a decode layer's scratch: a few tensors of 10-20 MB alive together, then freed
    a, b, c = torch.ones(2_600_000), torch.ones(2_600_000), torch.ones(5_200_000)
    d = a + b
    del a, b, c, d

for _ in range(3):  # the first steps grow the heap in either mode
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _minor_faults(mode: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    took, faults = done.stdout.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_retained_memory_is_reused_without_page_faults() -> None:
    took, retained = _minor_faults("retain")
    took_control, mapped = _minor_faults("mapped")
    assert took == took_control == "True"
    one_step_pages = 4 * 2_600_000 * 5 // 4096  # what one step touches
    # Mapped blocks fault their pages in on every step; retained ones come back from the heap.
    # Twenty retained steps fault in less than one step's pages in all (a loaded CI machine
    # measured 2,539 stray faults, from the allocator's own bookkeeping and thread stacks), and
    # under a twentieth of what the mapped control faults.
    assert mapped >= 20 * one_step_pages // 2
    assert retained < one_step_pages
    assert retained * 20 < mapped


def test_other_platforms_are_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(host_memory.sys, "platform", "darwin")
    assert host_memory.retain_freed_host_memory() is False
