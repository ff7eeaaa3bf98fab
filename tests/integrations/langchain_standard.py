"""langchain-tests' ``ChatModelIntegrationTests`` configured for ``PaskChatModel``.

Not collected by default (the file name does not start with ``test_``): the whole suite takes
tens of minutes on a CPU, so ``python -m pask_agent.eval.langchain_suite`` runs it and writes
``results/langchain_integration.{json,md}``, and ``test_langchain_model.py`` runs a subset in CI.

Capabilities are declared with the suite's own flags: multimodal inputs (images, image URLs,
PDFs, audio, video, image/PDF tool messages) are unsupported; everything else is on, VCR
tests included.
"""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import ChatModelIntegrationTests

from pask_agent.integrations.langchain import PaskChatModel

SUITE_MAX_TOKENS = 64  # enough for the suite's jokes and tool calls, short for a CPU


class TestPaskChatModelIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[PaskChatModel]:
        return PaskChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "default", "max_tokens": SUITE_MAX_TOKENS}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True  # text, tool_use and thinking blocks; images are refused separately

    @property
    def enable_vcr_tests(self) -> bool:
        # The model runs in-process: there is no HTTP to record, so the cassette stays empty
        # and ``test_stream_time`` streams on the real model every time.
        return True

    @property
    def model_override_value(self) -> str:
        return "smollm2-135m"

    # Multimodal inputs: the bundled models read text only.
    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False
