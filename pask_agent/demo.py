"""``make demo``: a tool-calling agent step and a structured call on the embedded default model,
at Full KV and under PASK, with the measured KV bytes of each."""

from __future__ import annotations

import time

import anyio
from pydantic import BaseModel

from pask_agent.runtime.models.loading import load_model
from pask_agent.runtime.runtime import Runtime


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city name, e.g. "Paris".
        unit: Temperature unit, "celsius" or "fahrenheit".
    """
    return f"21 degrees {unit} and sunny in {city}"


def convert_currency(amount: float, from_currency: str, to_currency: str) -> float:
    """Convert an amount of money between two ISO 4217 currencies.

    Args:
        amount: The amount to convert.
        from_currency: Three-letter code of the source currency.
        to_currency: Three-letter code of the target currency.
    """
    return round(amount * 1.08, 2)


class Flight(BaseModel):
    origin: str
    destination: str
    passengers: int
    date: str


async def main() -> None:
    t0 = time.perf_counter()
    print("loading the default model (the first run converts it once; later runs take seconds)")
    loaded = await anyio.to_thread.run_sync(load_model, "default")
    print(f"loaded {loaded.path} in {time.perf_counter() - t0:.1f}s\n")
    question = "How warm is it in Lisbon right now, in fahrenheit?"
    calls = {}
    async with Runtime.open(loaded) as rt:
        for policy, budget in (("full", None), ("pask", 0.33)):
            t0 = time.perf_counter()
            result = await rt.chat(
                [{"role": "user", "content": question}],
                tools=[get_weather, convert_currency],
                policy=policy,
                budget=budget,
                max_new_tokens=64,
            )
            u = result.usage
            print(f"=== policy={policy} budget={budget} ({time.perf_counter() - t0:.1f}s) ===")
            for call in result.tool_calls:
                print(f"tool call: {call.name}({call.arguments})")
            calls[policy] = [(c.name, c.arguments) for c in result.tool_calls]
            print(
                f"[kv] prompt={u.prompt_tokens} new={u.completion_tokens} "
                f"kv={u.kv_bytes}B of full {u.full_kv_bytes}B -> measured B={u.measured_b:.3f}"
                f", peak={u.peak_kv_bytes}B\n"
            )
        # PASK does not make Full KV's call on every request (README, "Results"): say which
        # way this one went rather than let the reader compare by eye
        same = calls["pask"] == calls["full"]
        print(f"PASK's call {'matches' if same else 'differs from'} Full KV's\n")
        flight = await rt.call(
            Flight,
            "Book a flight for two passengers from Boston to Denver on December 18, 2026.",
            max_new_tokens=64,
        )
        print(f"structured call -> {flight!r}")


if __name__ == "__main__":
    anyio.run(main)
