"""``pask-agent bench --peer llamacpp`` (``eval/bench_peers.py``): reading llama.cpp's own
benchmark output, the command it runs, the files it writes, and the errors a user meets before
the peer is built. The peer itself is built by ``make peer-llamacpp``, never in CI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pask_agent.cli import main as cli_main
from pask_agent.errors import ConfigError, ModelNotAvailableError
from pask_agent.eval.bench_peers import llamacpp_command, parse_llamacpp, table, write
from pask_agent.runtime.models.loading import BUNDLED, bundled_gguf

# What llama-batched-bench --output-format jsonl -lv 4 prints: log lines on stderr, one JSON
# line a result on stdout (llama.cpp's tools/batched-bench at the pinned version).
STDERR = (
    "0.00.311.092 I llama_context: n_seq_max             = 8\n"
    "0.00.311.170 I llama_kv_cache:        CPU KV buffer size =    98.00 MiB\n"
    "0.00.311.196 I llama_kv_cache: size =   98.00 MiB (  1040 cells,  24 layers,  8/8 seqs), "
    "K (q4_0):   49.00 MiB, V (q4_0):   49.00 MiB\n"
)
STDOUT = "\n".join(
    json.dumps(
        {
            "n_kv_max": 8320,
            "n_batch": 2048,
            "n_ubatch": 512,
            "flash_attn": 1,
            "is_pp_shared": 0,
            "n_gpu_layers": -1,
            "n_threads": 2,
            "n_threads_batch": 2,
            "pp": 512,
            "tg": 64,
            "pl": pl,
            "n_kv": pl * 576,
            "t_pp": t_pp,
            "speed_pp": pl * 512 / t_pp,
            "t_tg": t_tg,
            "speed_tg": pl * 64 / t_tg,
            "t": t_pp + t_tg,
            "speed": 1.0,
        }
    )  # fmt: skip
    for pl, t_pp, t_tg in ((1, 2.5, 2.9), (8, 21.0, 6.4))
)


def test_rows_take_speeds_from_the_results_and_kv_bytes_from_the_log() -> None:
    rows = parse_llamacpp(STDOUT, STDERR, "q4_0")
    assert [r["concurrency"] for r in rows] == [1, 8]
    one, eight = rows
    assert one["prefill_tok_s"] == round(512 / 2.5, 2) and one["ttft_s"] == 2.5
    assert one["decode_tok_s"] == round(64 / 2.9, 2)
    assert eight["decode_tok_s"] == round(8 * 64 / 6.4, 2) and eight["ttft_s"] is None
    # 98 MiB over 8 streams of 1040 cells: bytes per token of all 24 layers
    assert one["kv_bytes_per_token"] == round(98 * 2**20 / (8 * 1040), 1)
    assert one["cache"] == "q4_0 KV" and one["threads"] == 2


def test_output_without_results_or_kv_line_is_a_typed_error() -> None:
    with pytest.raises(ConfigError, match="make peer-llamacpp"):
        parse_llamacpp("", STDERR, "f16")
    with pytest.raises(ConfigError, match="llama_kv_cache"):
        parse_llamacpp(STDOUT, "no log", "f16")


def test_command_sizes_the_context_for_the_widest_level() -> None:
    cmd = llamacpp_command(Path("b"), Path("m.gguf"), 4096, 64, [1, 8], 2, "q8_0")
    assert cmd[cmd.index("-c") + 1] == str(8 * (4096 + 64))
    assert cmd[cmd.index("-npl") + 1] == "1,8" and cmd[cmd.index("-ctv") + 1] == "q8_0"
    assert cmd[cmd.index("-t") + 1] == "2" and "jsonl" in cmd


def test_files_hold_the_rows_the_table_and_a_plot(tmp_path: Path) -> None:
    rows = parse_llamacpp(STDOUT, STDERR, "q4_0")
    meta = {"command": "c", "git_commit": "g", "machine": "m", "model": "default",
            "threads": 2, "new_tokens": 64, "llamacpp_source": "s"}  # fmt: skip
    write(rows, meta, tmp_path / "peers")
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved["rows"] == rows and saved["git_commit"] == "g"
    md = (tmp_path / "peers.md").read_text()
    assert table(rows) in md and "(peers.png)" in md
    assert (tmp_path / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_with_the_peer_unbuilt_says_how_to_build_it(tmp_path: Path, capsys) -> None:
    code = cli_main(["bench", "--peer", "llamacpp", "--peer-binary", str(tmp_path / "none")])
    assert code != 0
    assert "make peer-llamacpp" in capsys.readouterr().err


def test_bundled_gguf_is_the_shipped_file_written_once(tmp_path: Path) -> None:
    out = bundled_gguf("smollm2", tmp_path / "s.gguf")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == BUNDLED["smollm2-135m"].sha256
    stamp = out.stat().st_mtime_ns
    assert bundled_gguf("smollm2-135m", out).stat().st_mtime_ns == stamp
    with pytest.raises(ModelNotAvailableError, match="not a bundled model"):
        bundled_gguf("nope", tmp_path / "n.gguf")
