"""The sandbox's world: one seeded, JSON-shaped state that every simulated tool reads and writes.

Why plain JSON (dicts, lists, strings, numbers) and not objects: the scorer compares the state
a predicted call leaves with the state the gold call leaves, and a test replays a whole
conversation from the seed; both are one ``==`` and one ``copy.deepcopy`` on plain data.
Why a seed and no ``hash()``: Python salts ``hash`` per process, so ids made from it would
change between runs; ids here come from ``random.Random(seed)`` at build time and from SHA-256
of ``(seed, counter)`` for what the tools create, so the same call on the same state makes the
same id, whichever process runs it.

A world holds a user, flights on a few routes, folders of files with owners, a product
catalog and the user's past orders; bookings, sent emails and new orders are added by the
tools (``travel.py``, ``files.py``, ``orders.py``).
"""

from __future__ import annotations

import hashlib
import random
from datetime import date, timedelta
from typing import Any

World = dict[str, Any]

CITIES = (
    "Boston", "Denver", "Chicago", "Seattle", "Austin", "Miami", "San Francisco", "New York",
    "Atlanta", "Phoenix", "Portland", "Nashville",
)  # fmt: skip
AIRLINES = (
    ("United", "UA"), ("Delta", "DL"), ("American", "AA"), ("JetBlue", "B6"),
    ("Alaska", "AS"), ("Southwest", "WN"),
)  # fmt: skip
HUBS = ("ORD", "DFW", "ATL", "DEN", "CLT", "PHX", "MSP", "DTW")
FIRST = (
    "Dana", "Priya", "Marcus", "Elena", "Tomás", "Grace", "Hiroshi", "Amara", "Liam", "Sofia",
    "Noah", "Fatima", "Owen", "Ines", "Kwame", "Rita", "Jonas", "Mei", "Victor", "Leila",
)  # fmt: skip
LAST = (
    "Whitfield", "Natarajan", "Okafor", "Lindqvist", "Alvarez", "Chen", "Tanaka", "Mensah",
    "O'Brien", "Rossi", "Keller", "Haddad", "Brennan", "Duarte", "Boateng", "Kowalski",
    "Fischer", "Wu", "Moreau", "Petrova",
)  # fmt: skip
STREETS = ("Maple Ave", "Harbor St", "Cedar Ln", "Elm St", "Park Rd", "Willow Way", "Lake Dr")
FOLDERS = ("Finance", "Marketing", "Engineering", "Legal", "Research", "Operations")
FILE_STEMS = (
    "budget", "forecast", "roadmap", "contract", "invoice_log", "survey_results", "brand_guide",
    "incident_report", "hiring_plan", "vendor_list", "quarterly_review", "design_spec",
    "pricing_model", "audit_notes", "launch_checklist", "meeting_minutes", "risk_register",
    "data_export", "press_kit", "training_deck",
)  # fmt: skip
FILE_TYPES = (("xlsx", "spreadsheet"), ("docx", "document"), ("pdf", "pdf"),
              ("pptx", "presentation"), ("csv", "csv"))  # fmt: skip
CATEGORIES = {
    "headphones": ("Wireless Headphones", "Noise-Cancelling Headphones", "Studio Headphones",
                   "Sport Earbuds", "Over-Ear Headphones", "Kids Headphones"),
    "desk lamp": ("LED Desk Lamp", "Architect Desk Lamp", "Clip-On Desk Lamp",
                  "Smart Desk Lamp", "Bankers Desk Lamp", "Dimmable Desk Lamp"),
    "backpack": ("Travel Backpack", "Laptop Backpack", "Hiking Backpack", "Rolltop Backpack",
                 "Daypack Backpack", "Anti-Theft Backpack"),
    "coffee beans": ("Colombian Coffee Beans", "Ethiopian Coffee Beans", "Espresso Coffee Beans",
                     "Decaf Coffee Beans", "Guatemalan Coffee Beans", "Sumatra Coffee Beans"),
    "keyboard": ("Mechanical Keyboard", "Wireless Keyboard", "Ergonomic Keyboard",
                 "Compact Keyboard", "Backlit Keyboard", "Split Keyboard"),
    "water bottle": ("Insulated Water Bottle", "Glass Water Bottle", "Collapsible Water Bottle",
                     "Filter Water Bottle", "Sport Water Bottle", "Kids Water Bottle"),
}  # fmt: skip
BRANDS = ("Northwind", "Acme", "Lumen", "Verdant", "Kestrel", "Orbit", "Halcyon", "Tidewater",
          "Summit", "Brightline")  # fmt: skip
ORDER_STATUSES = ("processing", "shipped", "delivered")
COMPANY = "acme-corp.com"
FIRST_DAY = date(2025, 5, 5)


def _code(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def new_id(world: World, prefix: str) -> str:
    """An id for something a tool creates: a function of the world's seed and counter only, so
    the gold call and an identical predicted call on copies of one state make the same id."""
    world["counter"] += 1
    digest = hashlib.sha256(f"{world['seed']}:{world['counter']}".encode()).hexdigest().upper()
    return f"{prefix}-{digest[:6]}"


def person(rng: random.Random, used: set[str]) -> dict[str, str]:
    while True:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        if name not in used:
            used.add(name)
            break
    local = name.lower().replace(" ", ".").replace("'", "").replace("á", "a")
    return {"name": name, "email": f"{local}@{COMPANY}"}


def make_world(seed: int) -> World:
    """The whole initial state of one conversation's sandbox, from ``seed`` alone."""
    rng = random.Random(seed)
    used: set[str] = set()
    user = person(rng, used)
    cities = rng.sample(CITIES, 4)
    home, trips = cities[0], cities[1:]
    user |= {
        "home_city": home,
        "address": f"{rng.randint(10, 980)} {rng.choice(STREETS)}, {home}",
    }
    colleagues = [person(rng, used) | {"department": rng.choice(FOLDERS)} for _ in range(8)]
    world: World = {
        "seed": seed,
        "counter": 0,
        "today": FIRST_DAY.isoformat(),
        "user": user,
        "colleagues": colleagues,
        "flights": [],
        "bookings": [],
        "files": [],
        "emails": [],
        "products": [],
        "orders": [],
    }
    for k, city in enumerate(trips):
        out_day = FIRST_DAY + timedelta(days=7 + 9 * k + rng.randint(0, 3))
        back_day = out_day + timedelta(days=rng.randint(3, 6))
        world["flights"] += _flights(rng, home, city, out_day)
        world["flights"] += _flights(rng, city, home, back_day)
    for folder in rng.sample(FOLDERS, 3):
        world["files"] += _files(rng, folder, colleagues)
    for category in CATEGORIES:
        world["products"] += _products(rng, category)
    world["orders"] = _past_orders(rng, world["products"], user["address"])
    return world


def _flights(rng: random.Random, origin: str, dest: str, day: date) -> list[dict[str, Any]]:
    count = rng.randint(6, 7)
    prices = rng.sample(range(89, 640), count)  # distinct, as a real fare table's tend to be
    departs = sorted(rng.sample(range(5 * 12, 22 * 12), count))  # distinct 5-minute slots
    durations = rng.sample(range(95, 420, 5), count)
    out = []
    for price, slot, minutes in zip(prices, departs, durations, strict=True):
        airline, code = rng.choice(AIRLINES)
        stops = rng.choice((0, 0, 0, 1, 1, 2))
        dep = slot * 5
        arr = dep + minutes
        out.append({
            "flight_id": "FL" + _code(rng, "ABCDEFGHJKLMNPQRSTUVWXYZ23456789", 5),
            "airline": airline,
            "flight_number": f"{code} {rng.randint(100, 2999)}",
            "origin": origin,
            "destination": dest,
            "date": day.isoformat(),
            "departure": f"{dep // 60:02d}:{dep % 60:02d}",
            "arrival": f"{arr // 60 % 24:02d}:{arr % 60:02d}" + ("+1" if arr >= 1440 else ""),
            "duration_minutes": minutes,
            "stops": stops,
            "layovers": rng.sample(HUBS, stops),
            "price_usd": price,
            "cabin": "economy",
            "seats_left": rng.randint(1, 9),
            "refundable": rng.random() < 0.4,
        })  # fmt: skip
    return out


def _files(rng: random.Random, folder: str, colleagues: list[dict[str, Any]]) -> list[dict]:
    count = rng.randint(7, 9)
    sizes = rng.sample(range(12_000, 48_000_000), count)
    stems = rng.sample(FILE_STEMS, count)
    out = []
    for stem, size in zip(stems, sizes, strict=True):
        ext, kind = rng.choice(FILE_TYPES)
        owner = rng.choice(colleagues)
        modified = FIRST_DAY - timedelta(days=rng.randint(1, 200), minutes=rng.randint(0, 1439))
        created = modified - timedelta(days=rng.randint(0, 300))
        shared = [c for c in rng.sample(colleagues, 3) if c is not owner][:2]
        out.append({
            "file_id": "file_" + _code(rng, "0123456789abcdef", 8),
            "name": f"{stem}_{rng.choice(('v1', 'v2', 'final', '2025', 'draft'))}.{ext}",
            "folder": folder,
            "type": kind,
            "owner": owner["email"],
            "owner_name": owner["name"],
            "size_bytes": size,
            "created": f"{created.isoformat()}T09:00:00Z",
            "modified": f"{modified.isoformat()}T{rng.randint(7, 19):02d}:"
            f"{rng.randint(0, 59):02d}Z",
            "shared_with": [{"email": c["email"], "role": rng.choice(("viewer", "editor"))}
                            for c in shared],
            "version": rng.randint(1, 14),
            "description": f"{stem.replace('_', ' ').capitalize()} for the {folder} team.",
        })  # fmt: skip
    return out


def _products(rng: random.Random, category: str) -> list[dict[str, Any]]:
    names = CATEGORIES[category]
    prices = rng.sample(range(900, 26_000, 7), len(names))
    ratings = rng.sample(range(31, 50), len(names))  # distinct, so no two products tie
    brands = rng.sample(BRANDS, len(names))
    return [
        {
            "product_id": f"P-{rng.randint(10000, 99999)}",
            "name": f"{brand} {name}",
            "brand": brand,
            "category": category,
            "price_usd": cents / 100,
            "rating": rating / 10,
            "reviews": rng.randint(12, 4800),
            "in_stock": rng.randint(3, 60),
            "ships_in_days": rng.randint(1, 6),
        }
        for name, cents, rating, brand in zip(names, prices, ratings, brands, strict=True)
    ]


def _past_orders(rng: random.Random, products: list[dict], address: str) -> list[dict]:
    out = []
    totals = rng.sample(range(1500, 90_000), 8)
    for k, total in enumerate(totals):
        status = ORDER_STATUSES[0] if k < 3 else rng.choice(ORDER_STATUSES)
        item = rng.choice(products)
        placed = FIRST_DAY - timedelta(days=rng.randint(1, 40))
        out.append({
            "order_id": f"ORD-{rng.randint(100000, 999999)}",
            "placed": placed.isoformat(),
            "status": status,
            "items": [{"product_id": item["product_id"], "name": item["name"],
                       "quantity": rng.randint(1, 3)}],
            "total_usd": total / 100,
            "ship_to": address,
        })  # fmt: skip
    rng.shuffle(out)
    return out
