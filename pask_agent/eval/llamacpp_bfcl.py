"""llama.cpp on our BFCL cases: what a user who runs the same GGUF through llama.cpp gets.

    make peer-llamacpp   # .peers/llamacpp/bin: llama-server (and llama-batched-bench)
    python -m pask_agent.eval.llamacpp_bfcl --split test --cases-per-category 50 \\
        --kv-types f16,q4_0 --out results/bfcl_llamacpp
    python -m pask_agent.eval.bfcl_eval --merge results/weights/bfcl_test_full_fp32 \\
        results/bfcl_llamacpp --out results/bfcl_llamacpp_paired

``llama-server`` loads the GGUF file we ship and reads its Q4_K_M blocks as stored. Each case
gets the prompt our runtime builds (``prepare_turn``: the same token ids, sent as ids) and our
tool-call grammar (``tool_call_ebnf``, the text our runtime compiles for xgrammar, with its rule
names spelled the way llama.cpp's GBNF parser reads them), ``tool_choice="required"``, parallel
calls only in the parallel categories, greedy (temperature 0), ``max_new_tokens`` 200, as
``eval/bfcl_eval.py`` asks. Our runtime continues an array of calls the model closes while it
still gives another call at least 1 % of the grammar's mass (``continue_calls_at``); llama.cpp
has no such option, so this peer applies the same rule between requests: when an answer closes
its array with a ``]`` token, the server's top-20 probabilities at that token say what share
the grammar's ``,`` tokens had against ``]``; at 1 % or more the answer is resumed from the
tokens before ``]`` plus the likeliest ``,`` token, with the grammar of the rest of the array
(the slot's cache keeps the tokens already decoded, so nothing is recomputed). This process
parses and scores the answers with our BFCL scorer and writes the
harness's files (``<out>.jsonl/.json/.md/.png``), one configuration per KV cache type named
``llama.cpp:<type>``; its measured ``B`` is the type's bytes per value over f16's
(q8_0: 34/64, q4_0: 18/64; llama.cpp keeps every token).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError, PaskError, exit_code
from pask_agent.eval.bfcl import BfclCase
from pask_agent.eval.bfcl_eval import (
    BfclWorkload,
    add_peer_arguments,
    peer_workload,
    print_summaries,
)
from pask_agent.eval.harness import Config, Measured, Row, Scored
from pask_agent.eval.harness_args import names
from pask_agent.eval.harness_report import write_report
from pask_agent.eval.harness_rows import RowFile
from pask_agent.record.provenance import provenance

SERVER = Path(".peers/llamacpp/bin/llama-server")
PREFIX = "llama.cpp:"
# bytes per KV value, against f16's 2 (ggml's block sizes: 32 values a block)
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
_INSTALL = "make peer-llamacpp"
# the rule our runtime decodes parallel calls with (RuntimeConfig.continue_calls_at's default)
CONTINUE_AT = 0.01


def gbnf(ebnf: str) -> str:
    """Our grammar text (xgrammar's EBNF) as llama.cpp's GBNF: the same rules, with ``_`` in
    rule names written ``-`` (GBNF names are letters, digits and dashes). Quoted literals and
    character classes are copied as they are; both dialects read the escapes we write."""
    out, i, n = [], 0, len(ebnf)
    while i < n:
        c = ebnf[i]
        if c in '"[':  # a literal or a class, up to its unescaped end
            end = '"' if c == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != end:
                j += 2 if ebnf[j] == "\\" else 1
            out.append(ebnf[i : j + 1])
            i = j + 1
        elif c == "_":
            out.append("-")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (localhost)
        return json.loads(response.read())


@contextmanager
def llama_server(
    binary: Path, gguf: Path, kv_type: str, threads: int, context: int, log: Path
) -> Iterator[str]:
    """A ``llama-server`` on a free local port with one slot; yields its base URL.

    Raises
    ------
    PaskError
        It exited or did not answer ``/health`` within two minutes (its log is named).
    """
    port = _free_port()
    cmd = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-c", str(context), "-np", "1", "-t", str(threads), "-tb", str(threads),
        "-ctk", kv_type, "-ctv", kv_type, "-fa", "on", "--no-webui",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise PaskError(f"llama-server exited {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise PaskError(f"llama-server did not come up in 120 s; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass(frozen=True)
class LlamacppWorkload(BfclWorkload):
    """``BfclWorkload``'s cases, groups and scorer; the answers come from ``llama-server``."""

    title: ClassVar[str] = "BFCL non-live through llama.cpp (same GGUF, our prompts and grammar)"

    def note(self, cases: int) -> str:
        return (
            f"{cases} BFCL v4 non-live cases ({self.per_category or 'all'} per category, split "
            f"{self.split!r}) through llama-server on the bundled GGUF (its Q4_K_M blocks read "
            "as stored): our prompt token ids and our tool-call grammar as GBNF, greedy, "
            f"max_new_tokens={self.max_new_tokens}, official AST checker; an array of calls "
            f"closed while another call had >= {CONTINUE_AT} of the grammar's mass is "
            "continued, as our runtime does. measured B = the KV type's bytes per value / "
            "f16's; every token kept."
        )


def _usage(record: dict[str, Any], kv_type: str, per_token: int) -> Any:
    from pask_agent.runtime.turns.results import Usage

    prompt, answer = int(record["prompt_tokens"]), len(record["token_ids"])
    share = KV_BYTES[kv_type] / KV_BYTES["f16"]
    full = (prompt + answer) * per_token
    return Usage(
        prompt_tokens=prompt, completion_tokens=answer, prefilled_tokens=prompt,
        kv_bytes=round(full * share), full_kv_bytes=full, measured_b=share,
        peak_kv_bytes=round(full * share), ttft_s=float(record["ttft_s"]),
        tpot_s=float(record["tpot_s"]), prompt_kv_bytes=round(prompt * per_token * share),
        prompt_full_kv_bytes=prompt * per_token,
    )  # fmt: skip


def score(
    workload: LlamacppWorkload, case: BfclCase, record: dict[str, Any], kv_type: str,
    per_token: int,
) -> Scored:  # fmt: skip
    """An answer scored as our harness scores ours: calls parsed from the text and checked
    against their schemas; a call that breaks its schema makes the row invalid."""
    from pask_agent.runtime.turns.outputs import parse_tool_calls
    from pask_agent.runtime.turns.results import ChatResult
    from pask_agent.runtime.turns.tool_validation import checked_tool_calls

    usage = _usage(record, kv_type, per_token)
    specs = case.tools()
    extra = {"kv_type": kv_type, "stop_type": record["stop_type"]}
    extra["continued"] = int(record.get("continued", 0))
    try:
        calls = checked_tool_calls(parse_tool_calls(record["text"], specs), specs)
    except PaskError as exc:
        detail = {"calls": [], "text": record["text"], "finish_reason": record["reason"]}
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return Scored(False, False, error, Measured.of([usage]), {**detail, **extra})
    reason = "tool_calls" if calls else record["reason"]
    result = ChatResult(record["text"], calls, usage, reason, tuple(record["token_ids"]))
    scored = workload.score(case, (result, None))
    return Scored(
        scored.correct, scored.valid_call, scored.error, scored.measured,
        {**scored.detail, **extra},
    )  # fmt: skip


def case_prompt(
    workload: LlamacppWorkload, tokenizer: Any, outputs: Any, case: BfclCase
) -> tuple[list[int], str]:
    """The prompt ids our runtime builds for ``case`` and its tool grammar as GBNF (the
    choices ``BfclWorkload.run`` makes: its ``tool_choice``, parallel per category)."""
    from pask_agent.grammars.json.tool_grammar import tool_call_ebnf
    from pask_agent.runtime.turns.prompting import prepare_turn

    r = case.request()
    choice = workload.tool_choice
    parallel = r["parallel_tool_calls"] if workload.parallel is None else workload.parallel
    turn = prepare_turn(
        tokenizer, outputs, r["messages"], r["tools"], choice, parallel, labels=False
    )
    ebnf = tool_call_ebnf(r["tools"], tool_choice=choice, parallel=parallel)
    return list(turn.prompt_ids), gbnf(ebnf)


# Between parallel calls the grammar writes `, ` and then a call, which opens with this text.
_NEXT_CALL = ', {"name": "'
_SEPARATOR = ", "
_TOP = 20


def continue_share(step: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """At a token that closed the array of calls (``]``), the share of the grammar's mass that
    went to starting another call, from the server's top probabilities there (before the
    grammar), and the likeliest token that writes all or part of the separator (``None`` if
    none of the top ones does)."""
    import math

    close = comma = 0.0
    best: dict[str, Any] | None = None
    for alt in step.get("top_logprobs") or []:
        text, p = str(alt.get("token", "")), math.exp(float(alt["logprob"]))
        if text == "]":
            close += p
        elif text and _NEXT_CALL.startswith(text):
            comma += p
            if _SEPARATOR.startswith(text) and (best is None or p > best["p"]):
                best = {"id": int(alt["id"]), "token": text, "p": p}
    total = close + comma
    return (comma / total if total else 0.0), best


def rest_of_calls(grammar: str, written: str) -> str:
    """``grammar`` (an array of parallel calls) for what follows once ``written``, a prefix of
    the separator, has been written after a complete call: the rest of the separator, a call,
    more calls, ``]``."""
    rest = _SEPARATOR[len(written) :]
    head = f'"{rest}" ' if rest else ""
    lines = grammar.splitlines()
    if lines[0] != "root ::= calls":
        raise ValueError("not the grammar of an array of parallel calls")
    return "\n".join([f'root ::= {head}call (", " call)* "]"', *lines[1:]])


def ask(
    url: str,
    prompt_ids: list[int],
    grammar: str,
    max_new_tokens: int,
    continue_calls_at: float | None = CONTINUE_AT,
) -> dict[str, Any]:
    """One greedy completion under ``grammar``, an array of calls continued as our runtime
    continues it (``continue_share``); the fields a row needs."""
    start = time.perf_counter()
    parallel = continue_calls_at is not None and grammar.startswith("root ::= calls")
    tokens: list[int] = []
    text, current = "", grammar
    prompt_ms = predicted_ms = 0.0
    continued = 0
    while True:
        reply = _post(
            f"{url}/completion",
            {
                "prompt": prompt_ids + tokens, "n_predict": max_new_tokens - len(tokens),
                "temperature": 0.0, "grammar": current, "cache_prompt": bool(tokens),
                "return_tokens": True, "n_probs": _TOP if parallel else 0,
            },
            timeout=600,
        )  # fmt: skip
        timings = reply.get("timings", {})
        prompt_ms += float(timings.get("prompt_ms", 0.0)) if not tokens else 0.0
        predicted_ms += float(timings.get("predicted_ms", 0.0))
        new = [int(t) for t in reply.get("tokens") or []]
        content = str(reply.get("content", ""))
        stop = str(reply.get("stop_type", ""))
        steps = [s for s in reply.get("completion_probabilities") or [] if s.get("token")]
        if parallel and stop == "eos" and steps and steps[-1]["token"] == "]":
            share, comma = continue_share(steps[-1])
            if share >= continue_calls_at and comma is not None:
                keep = len(steps) - 1  # the tokens before `]` (a stop token writes no text)
                if keep < len(new) and len(tokens) + keep + 1 < max_new_tokens:
                    tokens += new[:keep] + [comma["id"]]
                    text += content[: -len("]")] + comma["token"]
                    current = rest_of_calls(grammar, comma["token"])
                    continued += 1
                    continue
        tokens += new
        text += content
        break
    return {
        "text": text, "token_ids": tokens, "prompt_tokens": len(prompt_ids), "stop_type": stop,
        "reason": "length" if stop == "limit" else "stop", "continued": continued,
        "ttft_s": prompt_ms / 1000, "tpot_s": predicted_ms / 1000 / max(len(tokens), 1),
        "seconds": time.perf_counter() - start,
    }  # fmt: skip


def evaluate(
    workload: LlamacppWorkload,
    kv_types: Sequence[str],
    out: Path,
    *,
    binary: Path = SERVER,
    model: str = "default",
    threads: int = 2,
    restart: bool = False,
    log: Callable[[str], None] = print,
) -> list[Any]:
    """Every case under every KV type through ``llama-server``; scored, written, resumable."""
    from pask_agent.eval.harness_report import summarize_rows
    from pask_agent.runtime.models.loading import (
        bundled_gguf,
        load_tokenizer,
        resolve_model_dir,
    )
    from pask_agent.runtime.turns.outputs import OutputCompiler

    if not binary.is_file():
        raise ConfigError(f"no llama-server at {binary}; build it with: {_INSTALL}")
    unknown = [k for k in kv_types if k not in KV_BYTES]
    if not kv_types or unknown:
        raise ConfigError(f"KV types {list(kv_types)}: name some of {', '.join(KV_BYTES)}")
    cases = {c.id: c for c in workload.cases()}
    source = (binary.parent.parent / "SOURCE").read_text().strip()
    settings = {"workload": workload.name, "model": model, "peer": source}
    settings["continue_calls_at"] = CONTINUE_AT
    settings |= workload.settings()
    started = provenance()
    file = RowFile(out.with_suffix(".jsonl"), workload)
    configs = [PREFIX + k for k in kv_types]
    budgets = {PREFIX + k: round(KV_BYTES[k] / KV_BYTES["f16"], 6) for k in kv_types}
    keys = [(c, budgets[c], cid) for c in configs for cid in cases]
    done = {} if restart else file.resume(settings, set(keys))
    references = ("full", configs[0])
    note = workload.note(len(cases))

    def write() -> list[Any]:
        rows = [done[k] for k in keys if k in done]
        file.rewrite(rows)
        return write_report(out, workload, rows, started, settings, references, note)

    write()
    tokenizer = load_tokenizer(model)
    config = json.loads((resolve_model_dir(model) / "config.json").read_text())
    outputs = OutputCompiler(tokenizer, int(config["vocab_size"]))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 2
    gguf = bundled_gguf(model, binary.parent.parent.parent / "models" / f"{model}.gguf")
    for kv_type, name in zip(kv_types, configs, strict=True):
        todo = [cid for cid in cases if (name, budgets[name], cid) not in done]
        if not todo:
            continue
        server_log = binary.parent.parent / "logs" / f"{out.name}.{kv_type}.log"
        server_log.parent.mkdir(parents=True, exist_ok=True)
        with llama_server(binary, gguf, kv_type, threads, 8192, server_log) as url:
            for cid in todo:
                case = cases[cid]
                ids, grammar = case_prompt(workload, tokenizer, outputs, case)
                record = ask(url, ids, grammar, workload.max_new_tokens)
                scored = score(workload, case, record, kv_type, per_token)
                row = Row.of(
                    workload, case, name, Config(name, budgets[name]), scored,
                    float(record["seconds"]), started,
                )  # fmt: skip
                done[row.key] = row
                file.append(row)
                mark = "ok " if row.correct else "BAD"
                log(f"[{row.label}] {row.id}: {mark} {record['seconds']:.1f}s {row.error}")
        write()
    return summarize_rows([done[k] for k in keys if k in done])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pask_agent.eval.llamacpp_bfcl", description=__doc__.splitlines()[0]
    )
    add_peer_arguments(p, "results/bfcl_llamacpp")
    p.add_argument(
        "--kv-types", default="f16,q4_0", help=f"comma-separated, of: {', '.join(KV_BYTES)}"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--server", type=Path, default=SERVER)
    args = p.parse_args(argv)

    def run() -> int:
        workload = peer_workload(LlamacppWorkload, args)
        summaries = evaluate(
            workload, names(args.kv_types), args.out, binary=args.server, model=args.model,
            threads=args.threads, restart=args.restart,
        )  # fmt: skip
        print_summaries(summaries, args.out)
        return 0

    return exit_code(run)


if __name__ == "__main__":
    raise SystemExit(main())
