"""Travel tools: ``search_flights``, ``book_flight``, ``cancel_flight_booking``.

Why these three: a search returns a list whose ids and prices exist only in the tool's result,
and a booking made from it returns a booking code that a later cancellation needs, so an agent
that cannot read its history cannot pick the flight or name the booking.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from pask_agent.eval.agent_sandbox.world import World, new_id

SPECS: tuple[dict[str, Any], ...] = (
    {
        "name": "search_flights",
        "description": "Search one-way economy flights between two cities on one date.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "Departure city"},
                "destination": {"type": "string", "description": "Arrival city"},
                "date": {"type": "string", "description": "Travel date, YYYY-MM-DD"},
            },
            "required": ["origin", "destination", "date"],
        },
    },
    {
        "name": "book_flight",
        "description": "Book a seat on a flight returned by search_flights.",
        "parameters": {
            "type": "object",
            "properties": {
                "flight_id": {
                    "type": "string",
                    "description": (
                        "The flight_id field (FL and 5 characters) of a flight search_flights "
                        "returned; not its flight_number"
                    ),
                },
                "passenger_name": {"type": "string", "description": "Full name of the traveler"},
            },
            "required": ["flight_id", "passenger_name"],
        },
    },
    {
        "name": "cancel_flight_booking",
        "description": "Cancel a flight booking by its booking id.",
        "parameters": {
            "type": "object",
            "properties": {
                "booking_id": {
                    "type": "string",
                    "description": "The booking_id field (BK-...) that book_flight returned",
                },
            },
            "required": ["booking_id"],
        },
    },
)

_LIST_KEYS = (
    "flight_id", "airline", "flight_number", "departure", "arrival", "duration_minutes", "stops",
    "layovers", "price_usd", "seats_left", "refundable",
)  # fmt: skip


def search_flights(world: World, origin: str, destination: str, date: str) -> dict[str, Any]:
    found = [
        f for f in world["flights"]
        if f["origin"].casefold() == origin.strip().casefold()
        and f["destination"].casefold() == destination.strip().casefold()
        and f["date"] == date.strip()
    ]  # fmt: skip
    return {
        "origin": origin,
        "destination": destination,
        "date": date,
        "currency": "USD",
        "count": len(found),
        "flights": [{k: f[k] for k in _LIST_KEYS} for f in found],
    }


def book_flight(world: World, flight_id: str, passenger_name: str) -> dict[str, Any]:
    flight = next((f for f in world["flights"] if f["flight_id"] == flight_id.strip()), None)
    if flight is None:
        return {"error": f"no flight with id {flight_id!r}"}
    if flight["seats_left"] < 1:
        return {"error": f"flight {flight_id} is sold out"}
    flight["seats_left"] -= 1
    taxes = round(flight["price_usd"] * 0.075 + 5.6, 2)
    row = 8 + world["counter"] % 22
    booking = {
        "booking_id": new_id(world, "BK"),
        "status": "confirmed",
        "passenger": passenger_name,
        "flight_id": flight["flight_id"],
        "seat": f"{row}{'ACDF'[world['counter'] % 4]}",
        "total_usd": round(flight["price_usd"] + taxes, 2),
    }
    world["bookings"].append(booking)
    check_in = date.fromisoformat(flight["date"]) - timedelta(days=1)
    return {
        **booking,
        "flight": {k: flight[k] for k in ("airline", "flight_number", "origin", "destination",
                                         "date", "departure", "arrival", "stops", "layovers")},
        "fare": {"base_usd": flight["price_usd"], "taxes_and_fees_usd": taxes,
                 "refundable": flight["refundable"],
                 "change_fee_usd": 0 if flight["refundable"] else 75},
        "baggage": "1 carry-on and 1 personal item included; first checked bag 35 USD",
        "check_in_opens": f"{check_in.isoformat()} {flight['departure']}",
    }  # fmt: skip


def cancel_booking(world: World, booking_id: str) -> dict[str, Any]:
    booking = next((b for b in world["bookings"] if b["booking_id"] == booking_id.strip()), None)
    if booking is None:
        return {"error": f"no booking with id {booking_id!r}"}
    if booking["status"] == "cancelled":
        return {"error": f"booking {booking_id} is already cancelled"}
    booking["status"] = "cancelled"
    flight = next(f for f in world["flights"] if f["flight_id"] == booking["flight_id"])
    flight["seats_left"] += 1
    refund = booking["total_usd"] if flight["refundable"] else 0.0
    return {
        "booking_id": booking["booking_id"],
        "status": "cancelled",
        "passenger": booking["passenger"],
        "flight": {k: flight[k] for k in ("flight_id", "airline", "flight_number", "origin",
                                         "destination", "date", "departure")},
        "cancelled_on": world["today"],
        "refund_usd": refund,
        "travel_credit_usd": 0.0 if flight["refundable"] else booking["total_usd"],
        "note": "Refunds go back to the original payment in 5-7 business days; travel credit "
        "is valid for 12 months.",
    }  # fmt: skip


FUNCTIONS = {"search_flights": search_flights, "book_flight": book_flight,
             "cancel_flight_booking": cancel_booking}  # fmt: skip
