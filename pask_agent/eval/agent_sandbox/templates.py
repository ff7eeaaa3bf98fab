"""Turn templates: what a user asks next, and the gold call that answers it, from the state.

Why templates read a memo of earlier results instead of the world: a request such as "book
the Delta flight at 14:05 from the ones you found" is answerable only from what the
conversation showed (the request names the flight, only the result holds its ``flight_id``),
so the gold call is computed from the recorded results (the memo), and the request names the
earlier turn in words ("the flights from Boston to Denver you found", "the order you placed
first"), never by the id the call needs.

Why a request names its record by a value the result shows (a departure time, a flight number,
a file or product name), not by an order the model would have to compute ("the cheapest",
"the largest"): with orders, Full KV itself answered 1 of 15 such turns on the first two dev
conversations (``results/archive/agent_dev2.md``), so those turns measured the 0.5B model's
arithmetic, not whether the cache kept what the call needs. Every name used is unique among
the records it picks from (checked here), so each request has one right answer.

A template returns a :class:`Plan` or ``None`` when the memo holds nothing it could refer
to; ``INDEPENDENT`` templates open new threads (searches, listings) and ``DEPENDENT`` ones
refer back.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pask_agent.eval.agent_sandbox.tools import Call
from pask_agent.eval.agent_sandbox.world import CATEGORIES, World


@dataclass(frozen=True, slots=True)
class Plan:
    """One turn before it runs: what the user says, the gold call, the turns it reads, and
    the assistant's closing line (written without the ids a later turn needs)."""

    kind: str
    request: str
    call: Call
    depends_on: tuple[int, ...]
    reply: Callable[[dict[str, Any]], str]


@dataclass
class Memo:
    """Earlier turns' results by tool: ``(turn index, result)``, and the ids cancelled since."""

    searches: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    bookings: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    listings: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    product_searches: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    created: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    order_lists: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)  # booking and order ids
    last_turn: int = -1

    def remember(self, kind: str, turn: int, call: Call, result: dict[str, Any]) -> None:
        self.last_turn = turn
        if "error" in result:
            return
        slot = {
            "search_flights": self.searches, "book_flight": self.bookings,
            "list_files": self.listings, "search_products": self.product_searches,
            "create_order": self.created, "list_orders": self.order_lists,
        }.get(call.name)  # fmt: skip
        if slot is not None:
            slot.append((turn, result))
        for key in ("booking_id", "order_id"):
            if call.name.startswith("cancel_") and key in call.arguments:
                self.cancelled.add(str(call.arguments[key]))


def _pick(rng: random.Random, items: list[Any]) -> Any:
    return items[rng.randrange(len(items))] if items else None


# ---------------------------------------------------------------------- travel
def search_flights(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    done = {(s["origin"], s["destination"], s["date"]) for _, s in memo.searches}
    routes = sorted({(f["origin"], f["destination"], f["date"]) for f in world["flights"]})
    todo = [r for r in routes if r not in done]
    if not todo:
        return None
    o, d, day = _pick(rng, todo)
    text = rng.choice((
        "Find flights from {o} to {d} on {day}.",
        "Can you look up flights from {o} to {d} for {day}?",
        "I need to get from {o} to {d} on {day}. What flights are there?",
    )).format(o=o, d=d, day=day)  # fmt: skip
    call = Call("search_flights", {"origin": o, "destination": d, "date": day})
    return Plan("search_flights", text, call, (), lambda r: (
        f"I found {r['count']} flights from {o} to {d} on {day}."))  # fmt: skip


def _unique(records: list[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> list[dict]:
    """The records whose ``key`` no other record shares: names that pick exactly one."""
    names = [key(r) for r in records]
    return [r for r, n in zip(records, names, strict=True) if names.count(n) == 1]


def _flight_name(rng: random.Random, flight: dict[str, Any], seen: list[dict]) -> tuple[str, bool]:
    """Words that pick ``flight`` by what its result shows, and whether they pick it out of
    every flight ``seen`` so far (else the request names the search too; departures are
    distinct within one search)."""
    if flight in _unique(seen, lambda f: f["flight_number"]) and rng.random() < 0.5:
        return f"flight {flight['flight_number']}", True
    words = f"the {flight['departure']} {flight['airline']} flight"
    return words, flight in _unique(seen, lambda f: f"{f['departure']} {f['airline']}")


def book_flight(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    booked = {b["flight_id"] for _, b in memo.bookings}
    options = [
        (turn, search, f)
        for turn, search in memo.searches
        for f in search["flights"]
        if f["seats_left"] > 0 and f["flight_id"] not in booked
    ]
    chosen = _pick(rng, options)
    if chosen is None:
        return None
    turn, search, flight = chosen
    words, alone = _flight_name(rng, flight, [f for _, s in memo.searches for f in s["flights"]])
    if rng.random() < 0.5:
        passenger = world["user"]["name"]
    else:
        first = rng.choice(("Sam", "Alex", "Jordan", "Robin"))
        passenger = f"{first} {world['user']['name'].split()[-1]}"
    whom = f"for {passenger}"  # named: "for me" asked the 0.5B model for the system line's name
    if turn == memo.last_turn and alone:
        text = f"Book {words} {whom}."
    else:
        route = f"{search['origin']} to {search['destination']} flights for {search['date']}"
        text = f"Of the {route} you found, book {words} {whom}."
    call = Call("book_flight", {"flight_id": flight["flight_id"], "passenger_name": passenger})
    line = f"Done: {passenger} is booked on {flight['airline']} {flight['flight_number']}."
    return Plan("book_flight", text, call, (turn,), lambda r: line)


def cancel_booking(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    live = [(t, b) for t, b in memo.bookings if b["booking_id"] not in memo.cancelled]
    if not live:
        return None
    options: list[tuple[str, tuple[int, dict]]] = []
    if memo.bookings[0][1]["booking_id"] not in memo.cancelled:
        options.append(("Cancel the first booking you made.", memo.bookings[0]))
    if len(memo.bookings) > 1 and live[-1] is memo.bookings[-1]:
        options.append(("Cancel the most recent flight booking.", live[-1]))
    for t, b in live:
        same = [x for x in live if x[1]["flight"]["destination"] == b["flight"]["destination"]]
        if len(same) == 1:
            dest = b["flight"]["destination"]
            options.append((f"I no longer need the flight to {dest}. Cancel that booking.", (t, b)))
    text, (turn, booking) = _pick(rng, options) or (None, (0, {}))
    if text is None:
        return None
    call = Call("cancel_flight_booking", {"booking_id": booking["booking_id"]})
    return Plan("cancel_booking", text, call, (turn,), lambda r: "That booking is cancelled.")


# ---------------------------------------------------------------------- files
def list_files(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    done = {ls["folder"] for _, ls in memo.listings}
    todo = sorted({f["folder"] for f in world["files"]} - done)
    if not todo:
        return None
    folder = _pick(rng, todo)
    text = rng.choice(("What files are in the {f} folder?", "List the {f} folder for me.",
                       "Show me what's in {f}."))  # fmt: skip
    return Plan("list_files", text.format(f=folder), Call("list_files", {"folder": folder}), (),
                lambda r: f"The {folder} folder has {r['file_count']} files.")  # fmt: skip


def _file_ref(memo: Memo, rng: random.Random) -> tuple[int, str, dict[str, Any]] | None:
    """A file of an earlier listing and the words that name it without its id (its name,
    unique within a folder)."""
    if not memo.listings:
        return None
    turn, listing = _pick(rng, memo.listings)
    file = _pick(rng, listing["files"])
    if rng.random() < 0.5:
        return turn, f"the file {file['name']}", file
    return turn, f"{file['name']} in {listing['folder']}", file


def read_file_info(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    ref = _file_ref(memo, rng)
    if ref is None:
        return None
    turn, words, file = ref
    text = rng.choice(("Show me the details of {w}.", "Pull up the full info for {w}."))
    return Plan("read_file_info", text.format(w=words),
                Call("read_file_info", {"file_id": file["file_id"]}), (turn,),
                lambda r: f"Here are the details of {file['name']}.")  # fmt: skip


SUBJECTS = ("Quick question", "Review needed", "Updated numbers", "Please take a look",
            "Access request", "Follow-up from today", "Comments on your file")  # fmt: skip


def send_email(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    ref = _file_ref(memo, rng)
    if ref is None:
        return None
    turn, words, file = ref
    subject = rng.choice(SUBJECTS)
    args: dict[str, Any] = {"to": file["owner"], "subject": subject}
    text = f'Email the owner of {words} with the subject "{subject}"'
    if rng.random() < 0.4:
        call = Call("send_file", {**args, "file_id": file["file_id"]})
        return Plan("send_file", text + " and attach that file.", call, (turn,),
                    lambda r: "The email has been sent with the file.")  # fmt: skip
    return Plan("send_email", text + ".", Call("send_email", args), (turn,),
                lambda r: "The email has been sent.")  # fmt: skip


def email_booking_code(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    """Two threads at once: the address from a listing, the subject from a booking."""
    live = [(t, b) for t, b in memo.bookings if b["booking_id"] not in memo.cancelled]
    ref = _file_ref(memo, rng)
    if ref is None or not live:
        return None
    b_turn, booking = _pick(rng, live)
    dest = booking["flight"]["destination"]
    if sum(b["flight"]["destination"] == dest for _, b in live) > 1:
        return None
    f_turn, words, file = ref
    text = (f"Send an email to the owner of {words}; the subject should be just the booking "
            f"code of the flight to {dest}.")  # fmt: skip
    call = Call("send_email", {"to": file["owner"], "subject": booking["booking_id"]})
    return Plan("email_booking_code", text, call, tuple(sorted({f_turn, b_turn})),
                lambda r: "Sent.")  # fmt: skip


# ---------------------------------------------------------------------- orders
def search_products(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    done = {s["query"] for _, s in memo.product_searches}
    todo = [c for c in CATEGORIES if c not in done]
    if not todo:
        return None
    query = _pick(rng, todo)
    text = rng.choice(("Search the store for {q}.", "Does the store have any {q}?",
                       "I'm shopping for {q}. What's available?"))  # fmt: skip
    return Plan("search_products", text.format(q=query), Call("search_products", {"query": query}),
                (), lambda r: f"There are {r['count']} results for {query}.")  # fmt: skip


def create_order(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    if not memo.product_searches:
        return None
    turn, search = _pick(rng, memo.product_searches)
    results = search["results"]
    product = _pick(rng, results)
    brand = product["name"].split()[0]
    unique_brand = product in _unique(results, lambda p: p["name"].split()[0])
    by_brand = unique_brand and rng.random() < 0.5
    words = f"the {brand} one" if by_brand else f"the {product['name']}"
    quantity = rng.choice((1, 1, 2, 3))
    ordered = {o["items"][0]["product_id"] for _, o in memo.created}
    if product["product_id"] in ordered or product["in_stock"] < quantity:
        return None
    what = words if quantity == 1 else f"{quantity} of {words}"
    if turn != memo.last_turn:
        text = f"From the {search['query']} results you found, order {what}."
    elif quantity == 1:
        text = f"I'll take {words}. Please order it."
    else:
        text = f"Order {what}."
    args = {"product_id": product["product_id"], "quantity": quantity}
    return Plan("create_order", text, Call("create_order", args), (turn,),
                lambda r: f"Ordered {quantity} x {product['name']}.")  # fmt: skip


def list_orders(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    done = {s["status"] for _, s in memo.order_lists}
    todo = [s for s in ("processing", "shipped", "delivered") if s not in done
            and sum(o["status"] == s for o in world["orders"]) >= 2]  # fmt: skip
    if not todo:
        return None
    status = _pick(rng, todo)
    text = rng.choice(("Which of my orders are {s}?", "Show me my {s} orders."))
    return Plan("list_orders", text.format(s=status), Call("list_orders", {"status": status}),
                (), lambda r: f"You have {r['count']} {status} orders.")  # fmt: skip


def cancel_order(memo: Memo, world: World, rng: random.Random) -> Plan | None:
    options: list[tuple[str, int, str]] = []
    live = [(t, o) for t, o in memo.created if o["order_id"] not in memo.cancelled]
    if live and live[0] is memo.created[0]:
        options.append(("Cancel the order you placed first.", live[0][0], live[0][1]["order_id"]))
    if len(memo.created) > 1 and live and live[-1] is memo.created[-1]:
        options.append(("Cancel the last order you placed.", live[-1][0], live[-1][1]["order_id"]))
    status = {o["order_id"]: o["status"] for o in world["orders"]}
    for turn, listing in memo.order_lists:
        named = _unique(listing["orders"], lambda o: o["items"][0]["name"])
        for order in named:
            if order["status"] == "processing" and status[order["order_id"]] == "processing":
                item = order["items"][0]["name"]
                options.append((f"From the processing orders you listed, cancel the one for "
                                f"the {item}.", turn, order["order_id"]))  # fmt: skip
    chosen = _pick(rng, options)
    if chosen is None:
        return None
    text, turn, order_id = chosen
    return Plan("cancel_order", text, Call("cancel_order", {"order_id": order_id}), (turn,),
                lambda r: "The order is cancelled.")  # fmt: skip


INDEPENDENT = (search_flights, list_files, search_products, list_orders)
DEPENDENT = (book_flight, cancel_booking, read_file_info, send_email, email_booking_code,
             create_order, cancel_order)  # fmt: skip
