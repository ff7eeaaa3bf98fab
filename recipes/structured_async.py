"""Recipe: an asyncio app that pulls typed records out of text with ``runtime.call``.

    python recipes/structured_async.py

``await rt.call(PydanticModel, prompt)`` decodes under the model's JSON-Schema grammar and
returns a validated instance; ``await rt.call([function, ...], prompt)`` returns the tool calls
the model made. Requests started together with ``asyncio.gather`` are decoded in one batch.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, Field

from pask_agent.runtime.runtime import Runtime

TICKETS = [
    "Hi, I'm Dana Whitfield. My order #4471 arrived with a cracked screen. Please replace it!",
    "This is Omar Haddad: the invoice for order 9120 charged me twice, I want a refund.",
]


class Ticket(BaseModel):
    """A support ticket, as the help desk files it."""

    customer: str = Field(description="full name of the customer")
    order_id: int = Field(description="the order number, digits only")
    issue: Literal["damaged", "billing", "delivery", "other"]


def schedule_callback(customer: str, minutes_from_now: int) -> str:
    """Schedule a phone call back to a customer.

    Args:
        customer: Full name of the customer.
        minutes_from_now: When to call, in minutes from now.
    """
    return f"call {customer} in {minutes_from_now} min"


async def main(tickets: list[str] = TICKETS) -> list[Ticket]:
    async with Runtime.open("default") as rt:
        parsed = await asyncio.gather(
            *(
                rt.call(Ticket, f"File this support message:\n{t}", max_new_tokens=48)
                for t in tickets
            )
        )
        for ticket in parsed:
            print(ticket)
        calls = await rt.call(
            [schedule_callback],
            f"Call {parsed[0].customer} back in 30 minutes.",
            max_new_tokens=40,
        )
        for call in calls:
            print(call.name, call.arguments, "->", schedule_callback(**call.arguments))
        return list(parsed)


if __name__ == "__main__":
    asyncio.run(main())
