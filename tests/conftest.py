"""Shared, offline, session-scoped fixtures: a tiny random model and the two bundled models."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run, so CI cannot turn red by chance; run
# with HYPOTHESIS_PROFILE=explore to search afresh. The long profile (HYPOTHESIS_PROFILE=long
# or --hypothesis-profile=long) searches afresh and multiplies the example count of every fuzz
# test that uses tests/fuzzing.py's fuzz_settings by 25: run it on the fuzz tests, not the suite.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.register_profile("long", deadline=None, max_examples=2500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton reads TRITON_INTERPRET when it is first imported, and other test modules import it
# (through transformers) before tests/kernels is collected: set it here, before anything.
if os.environ.get("PASK_KERNEL_DEVICE", "cpu") != "cuda":
    os.environ["TRITON_INTERPRET"] = "1"
# `make test` runs two pytest-xdist workers on the 2-core machine: each computes with its share
# of the cores (two workers of two threads each would spin against each other). Set before
# torch is imported, so the subprocesses the tests start inherit it too.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, _share))


_SUITE_STARTED = time.monotonic()
# Seconds each test file took in a measured run (setup, call and teardown summed): `make test`
# hands files to its two workers longest first (with xdist's own reorder by test count off), so
# the run does not end on one worker finishing a long file while the other idles. Refresh with
# PASK_FILE_SECONDS_OUT=tests/file_seconds.json make test; a file not listed runs last.
_FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
_SECONDS_BY_FILE: dict[str, float] = {}
_RSS_GROWTH: list[tuple[float, str]] = []  # (GiB the process grew during a test, test id)


def _status_gib(field: str) -> float:
    status = Path("/proc/self/status")
    found = re.search(rf"{field}:\s+(\d+) kB", status.read_text()) if status.exists() else None
    return int(found.group(1)) / 2**20 if found else 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Note how much each test (its setup, call and teardown) grew the process: the suite's
    10 GB limit is kept by finding what holds memory, and session fixtures show up on the
    first test that asks for them."""
    before = _status_gib("VmRSS")
    _TREE_MEMORY.note_running(item.nodeid)
    yield
    if nextitem is None or nextitem.module is not item.module:
        _close_integration_runtimes()
        gc.collect()  # a module's fixtures are gone: free what their reference cycles held
    _give_back_freed_heap()
    _RSS_GROWTH.append((_status_gib("VmRSS") - before, item.nodeid))


def _close_integration_runtimes() -> None:
    """Stop the runtimes LangChain models and SQL assistants opened for the file that ended.

    Those share one runtime per model through a process-wide registry that serves until the
    process exits (``integrations/_portal.py``): right for an application, but in a worker it
    kept a default-model runtime (its model and KV pools) alive through every later file.
    The next file that needs one opens it again."""
    portal = sys.modules.get("pask_agent.integrations._portal")
    if portal is not None:
        portal.runtime_registry().close_all()


def _give_back_freed_heap() -> None:
    """Return the heap's free pages to the system after each test.

    A runtime raises glibc's mmap and trim thresholds for the whole process
    (``runtime/memory/host_memory.py``): right for a server with one runtime, but in a test
    process that opens hundreds of runtimes and models, every tensor under 32 MiB then comes
    from one heap that is trimmed only from its top, and the process's RSS ratchets up test by
    test (a worker was killed for memory at 10 GiB). ``malloc_trim`` gives back free pages
    anywhere in the heap.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    try:
        return ctypes.CDLL(name) if name and hasattr(ctypes.CDLL(name), "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


def _own_figures() -> dict:
    top = sorted(_RSS_GROWTH, reverse=True)[:8]
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    return {"hwm": _status_gib("VmHWM"), "child": child, "growth": top}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its peak and largest growths to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["pask_memory"] = json.dumps(_own_figures())


_WORKER_FIGURES: list[dict] = []


class _TreeMemory:
    """The suite's real peak: the proportional set size (PSS) of pytest and every process it
    started (xdist workers, the subprocesses tests run), summed and sampled twice a second.

    PSS splits a page shared by several processes among them, so shared libraries and a model
    file two processes map count once; summing each worker's own peak (``VmHWM``) counts
    them twice and adds peaks that never coincide. Each tick reads RSS first and PSS only when
    the RSS sum could beat the peak so far (PSS never exceeds RSS). Linux only (``/proc``)."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self.peak_parts: list[tuple[int, str]] = []  # (KiB, what) of each process at the peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suite-memory", daemon=True)

    def start(self) -> None:
        if Path("/proc/self/smaps_rollup").exists():
            # workers (started after this, with this environment) say which test they run
            os.environ["PASK_SUITE_RUNNING_DIR"] = tempfile.mkdtemp(prefix="pask-suite-")
            self._thread.start()

    @staticmethod
    def note_running(nodeid: str) -> None:
        """Leave this process's current test where the sampler reads it (a worker's part of the
        peak is then named by its test, not by pytest's command line)."""
        folder = os.environ.get("PASK_SUITE_RUNNING_DIR")
        if folder:
            with contextlib.suppress(OSError):
                Path(folder, str(os.getpid())).write_text(nodeid)

    def stop(self) -> float:
        """Stop sampling; the peak in GiB (0.0 where ``/proc`` cannot tell)."""
        if not self._thread.is_alive():
            return 0.0  # never started here: an xdist worker (the controller samples)
        self._stop.set()
        self._thread.join(timeout=2)
        shutil.rmtree(os.environ.get("PASK_SUITE_RUNNING_DIR", ""), ignore_errors=True)
        return self.peak_kib / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            tree = self._tree()
            # PSS <= RSS: a tick whose RSS sum is below the peak cannot set a new one, and RSS
            # (statm) is free where PSS (smaps_rollup walks every page table: ~30 ms for a
            # worker holding the default model) would cost a few per cent of a core.
            if sum(self._rss_kib(pid) for pid in tree) <= self.peak_kib:
                continue
            parts = self._pss(tree)
            total = sum(kib for kib, _ in parts)
            if total > self.peak_kib:
                self.peak_kib, self.peak_parts = total, sorted(parts, reverse=True)

    @staticmethod
    def _rss_kib(pid: int) -> int:
        try:
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return 0
        return pages * (os.sysconf("SC_PAGE_SIZE") // 1024)

    @staticmethod
    def _what(pid: int) -> str:
        folder = os.environ.get("PASK_SUITE_RUNNING_DIR", "")
        try:
            return "test " + Path(folder, str(pid)).read_text()
        except OSError:
            pass
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return "?"
        return " ".join(a.decode(errors="replace") for a in argv).replace("\n", " ")[:120]

    @staticmethod
    def _tree() -> set[int]:
        """This process and every process it started, directly or not."""
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the process ended
            parents[int(stat.parent.name)] = int(fields[1])
        tree, grew = {os.getpid()}, True
        while grew:
            more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
            tree |= more
            grew = bool(more)
        return tree

    @classmethod
    def _pss(cls, tree: set[int]) -> list[tuple[int, str]]:
        parts = []
        for pid in tree:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            found = re.search(r"^Pss:\s+(\d+) kB", rollup, re.M)
            if found:
                parts.append((int(found.group(1)), cls._what(pid)))
        return parts


_TREE_MEMORY = _TreeMemory()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = json.loads(_FILE_SECONDS.read_text()) if _FILE_SECONDS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _SECONDS_BY_FILE[path] = _SECONDS_BY_FILE.get(path, 0.0) + report.duration


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        _TREE_MEMORY.start()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    figures = getattr(node, "workeroutput", {}).get("pask_memory")
    if figures:
        _WORKER_FIGURES.append(json.loads(figures))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the suite's wall time and peak memory, so CI's log shows both against the suite's
    limits (20 minutes, 10 GB on the 2-core CI machine). The suite's peak is the sampled PSS of
    the whole process tree (``_TreeMemory``); each pytest process's own peak (``VmHWM``) is
    printed beside it, but those need not coincide, so their sum would overstate the suite's.
    For subprocesses only ``ru_maxrss`` of the largest child exists, and Linux keeps a forked
    child's inherited peak across exec, so that figure is an upper bound."""
    minutes = (time.monotonic() - _SUITE_STARTED) / 60
    if os.environ.get("PASK_FILE_SECONDS_OUT") and not hasattr(
        terminalreporter.config, "workerinput"
    ):
        ranked = sorted(_SECONDS_BY_FILE.items(), key=lambda kv: -kv[1])
        Path(os.environ["PASK_FILE_SECONDS_OUT"]).write_text(
            json.dumps({path: round(s, 1) for path, s in ranked}, indent=1) + "\n"
        )
    tree_peak = _TREE_MEMORY.stop()
    if tree_peak:
        terminalreporter.write_line(
            f"suite peak memory: {tree_peak:.2f} GiB (PSS of pytest, its workers and every "
            "subprocess, summed, sampled every 0.5 s)"
        )
        for kib, what in _TREE_MEMORY.peak_parts:
            if kib >= 2**18:  # a quarter GiB
                terminalreporter.write_line(f"  at the peak: {kib / 2**20:.2f} GiB {what}")
    workers = _WORKER_FIGURES or [_own_figures()]
    peaks = " + ".join(f"{w['hwm']:.2f}" for w in workers)
    child = max(w["child"] for w in workers)
    memory = (  # the sampled PSS peak where /proc has it; else an upper bound
        f"peak memory {tree_peak:.2f} GiB (PSS, above)"
        if tree_peak
        else f"peak memory at most {sum(w['hwm'] for w in workers):.2f} GiB"
    )
    terminalreporter.write_line(
        f"suite: {minutes:.1f} min wall, {memory}; each pytest process's own RSS peak, at its "
        f"own moment: {peaks} GiB; largest subprocess at most {child:.2f} GiB (ru_maxrss, "
        "which counts pages a fork inherited)"
    )
    grew = sorted((tuple(g) for w in workers for g in w["growth"]), reverse=True)[:8]
    terminalreporter.write_line(
        "largest RSS growth: " + ", ".join(f"{g:+.2f} GiB {n}" for g, n in grew if g >= 0.1)
    )


@pytest.fixture(scope="session")
def tiny_model():
    """A 6-layer Qwen2 with random weights (GQA 4:2, head dim 16): fast store/seam tests."""
    from tiny_models import tiny_qwen2

    return tiny_qwen2(512)


@pytest.fixture(scope="session")
def smollm2():
    from pask_agent.runtime.models.loading import load_model

    return load_model("smollm2-135m")


# The default model a worker holds between test files (about 3 GB once converted for oneDNN).
# Not a session fixture: a file whose subprocesses load a model themselves asks for
# ``no_default_model_here`` and the worker lets its copy go meanwhile, so the suite never holds
# two workers' copies and a subprocess's model at once (the suite's peak, over 10 GB).
_DEFAULT_MODEL: dict[str, object] = {}


@pytest.fixture(scope="module")
def default_model():
    from pask_agent.runtime.models.loading import load_model

    if "default" not in _DEFAULT_MODEL:
        _DEFAULT_MODEL["default"] = load_model("default")  # ~8 s again after an eviction
    return _DEFAULT_MODEL["default"]


@pytest.fixture(scope="module")
def no_default_model_here() -> None:
    """For files whose subprocesses load a model (the default one, or SmolLM2 beside a worker
    that still held the default one): this worker drops its own copy of the default model."""
    _DEFAULT_MODEL.clear()
    gc.collect()
    _give_back_freed_heap()
