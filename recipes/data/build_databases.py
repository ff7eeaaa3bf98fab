"""Build the project's sample SQLite databases: ``shop.sqlite`` and ``school.sqlite``.

Why: no package ships BIRD or Spider databases offline, so text-to-SQL tests, calibration and
the SQL assistant run on these two. They are small (a few hundred to a few thousand rows per
table, well under 2 MB each) but realistic: foreign keys, dates, NULLs, composite primary keys,
and (in ``school``) column names with spaces that must be double-quoted.

The build is deterministic: one seeded ``random.Random`` per database, rows inserted in a fixed
order, the file written to a temporary name, vacuumed and renamed. With the same SQLite library
version the bytes are identical; across versions the content (``iterdump``) is.

Usage: ``python recipes/data/build_databases.py [--out DIR]`` (default: this folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent

FIRST_NAMES = (
    "Emma Liam Olivia Noah Ava Elijah Sophia Lucas Isabella Mason Mia Ethan Amelia James Harper "
    "Benjamin Evelyn Henry Abigail Alexander Emily Daniel Ella Matthew Scarlett Jackson Grace "
    "Sebastian Chloe Jack Lily Owen Zoe Samuel Nora David Hannah Joseph Leah Carter Aria Wyatt "
    "Layla John Riley Leo Luna Julian Sofia Mateo Camila Hugo Ines Lars Freya Kenji Yuki Priya "
    "Arjun Fatima Omar Chen Mei Lukas Marta Pablo Lucia"
).split()
LAST_NAMES = (
    "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez "
    "Gonzalez Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris "
    "Sanchez Clark Ramirez Lewis Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill "
    "Flores Green Adams Nelson Baker Hall Rivera Campbell Mitchell Carter Roberts Muller Schmidt "
    "Rossi Dubois Tanaka Sato Kim Park Singh Patel Silva Costa Novak Jensen"
).split()
CITIES = (
    ("Berlin", "Germany"),
    ("Munich", "Germany"),
    ("Hamburg", "Germany"),
    ("Paris", "France"),
    ("Lyon", "France"),
    ("Madrid", "Spain"),
    ("Barcelona", "Spain"),
    ("Rome", "Italy"),
    ("Milan", "Italy"),
    ("London", "United Kingdom"),
    ("Manchester", "United Kingdom"),
    ("New York", "USA"),
    ("Chicago", "USA"),
    ("Austin", "USA"),
    ("Seattle", "USA"),
    ("Toronto", "Canada"),
    ("Vancouver", "Canada"),
    ("Tokyo", "Japan"),
    ("Osaka", "Japan"),
    ("Sydney", "Australia"),
)
SUPPLIERS = (
    ("Nordic Goods AB", "Sweden"),
    ("Acme Supply Co", "USA"),
    ("Rheinland Handel GmbH", "Germany"),
    ("Iberia Trading SL", "Spain"),
    ("Kanto Imports KK", "Japan"),
    ("Maple Wholesale Inc", "Canada"),
    ("Atelier Lumiere SARL", "France"),
    ("Southern Cross Pty", "Australia"),
)
# (name, typical price in USD); the built price varies around it by up to 12 %.
PRODUCTS: dict[str, tuple[tuple[str, float], ...]] = {
    "Electronics": (
        ("Wireless Mouse", 24.0),
        ("Mechanical Keyboard", 89.0),
        ("USB-C Hub", 39.0),
        ("Noise Cancelling Headphones", 249.0),
        ("Bluetooth Speaker", 59.0),
        ("27-inch Monitor", 299.0),
        ("Webcam HD", 69.0),
        ("Power Bank", 35.0),
        ("Smart Watch", 199.0),
        ("E-Reader", 129.0),
        ("Portable SSD", 109.0),
        ("Gaming Controller", 55.0),
    ),
    "Kitchen": (
        ("Chef Knife", 79.0),
        ("Cast Iron Skillet", 45.0),
        ("French Press", 29.0),
        ("Electric Kettle", 39.0),
        ("Blender", 89.0),
        ("Cutting Board", 25.0),
        ("Stand Mixer", 329.0),
        ("Espresso Machine", 449.0),
        ("Rice Cooker", 59.0),
        ("Toaster", 35.0),
    ),
    "Books": (
        ("SQL for Beginners", 32.0),
        ("The Pragmatic Engineer", 41.0),
        ("Deep Learning Basics", 48.0),
        ("Gardening Year-Round", 22.0),
        ("World Atlas", 35.0),
        ("Mystery at Midnight", 15.0),
        ("Cooking for Two", 24.0),
        ("History of Rome", 19.0),
        ("Poems of the Sea", 12.0),
        ("Startup Playbook", 27.0),
    ),
    "Garden": (
        ("Garden Hose", 34.0),
        ("Pruning Shears", 22.0),
        ("Raised Bed Kit", 119.0),
        ("Bird Feeder", 28.0),
        ("Solar Lights", 39.0),
        ("Compost Bin", 69.0),
        ("Watering Can", 18.0),
        ("Lawn Mower", 289.0),
    ),
    "Sports": (
        ("Yoga Mat", 29.0),
        ("Running Shoes", 119.0),
        ("Tennis Racket", 139.0),
        ("Dumbbell Set", 79.0),
        ("Cycling Helmet", 59.0),
        ("Water Bottle", 19.0),
        ("Camping Tent", 189.0),
        ("Hiking Backpack", 99.0),
        ("Jump Rope", 12.0),
        ("Football", 25.0),
    ),
    "Toys": (
        ("Building Blocks", 49.0),
        ("Puzzle 1000 Pieces", 19.0),
        ("Remote Control Car", 59.0),
        ("Plush Bear", 21.0),
        ("Board Game Classic", 34.0),
        ("Art Set", 27.0),
        ("Kite", 16.0),
        ("Science Kit", 39.0),
    ),
}
ORDER_STATUSES = (
    "delivered",
    "delivered",
    "delivered",
    "shipped",
    "processing",
    "cancelled",
    "returned",
)

DEPARTMENTS = (
    ("Mathematics", "North Hall", 182000.0),
    ("Science", "Lab Building", 245000.0),
    ("English", "West Wing", 121000.0),
    ("History", "West Wing", 98000.0),
    ("Computer Science", "Tech Center", 210000.0),
    ("Arts", "Studio Annex", 87000.0),
    ("Physical Education", "Gymnasium", 76000.0),
    ("Languages", "North Hall", 104000.0),
)
COURSES = {
    "Mathematics": (
        "Algebra I",
        "Geometry",
        "Algebra II",
        "Precalculus",
        "Calculus AB",
        "Statistics",
        "Calculus BC",
    ),
    "Science": (
        "Biology",
        "Chemistry",
        "Physics",
        "Earth Science",
        "AP Biology",
        "AP Chemistry",
        "Environmental Science",
        "AP Physics",
    ),
    "English": (
        "English 9",
        "English 10",
        "American Literature",
        "British Literature",
        "Creative Writing",
        "AP Language",
    ),
    "History": ("World History", "US History", "Government", "Economics", "AP European History"),
    "Computer Science": (
        "Intro to Programming",
        "Web Development",
        "Data Structures",
        "AP Computer Science A",
        "Robotics",
        "Databases",
    ),
    "Arts": ("Drawing", "Painting", "Photography", "Music Theory", "Choir", "Theater"),
    "Physical Education": ("Fitness", "Team Sports", "Health", "Swimming"),
    "Languages": (
        "Spanish I",
        "Spanish II",
        "French I",
        "French II",
        "German I",
        "Latin I",
        "Mandarin I",
    ),
}
LEVELS = ("Introductory", "Intermediate", "Advanced")
TERMS = ("2023-Fall", "2024-Spring", "2024-Fall", "2025-Spring")
SCHOOL_CITIES = ("Springfield", "Riverside", "Fairview", "Franklin", "Greenville", "Madison")


def _day(rng: random.Random, start: dt.date, end: dt.date) -> str:
    return (start + dt.timedelta(days=rng.randrange((end - start).days + 1))).isoformat()


def _email(first: str, last: str, n: int, domain: str) -> str:
    return f"{first.lower()}.{last.lower()}{n}@{domain}"


SHOP_DDL = """
CREATE TABLE suppliers (
  supplier_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  country TEXT NOT NULL
);
CREATE TABLE customers (
  customer_id INTEGER PRIMARY KEY,
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  email TEXT NOT NULL UNIQUE,
  city TEXT NOT NULL,
  country TEXT NOT NULL,
  signup_date DATE NOT NULL,
  loyalty_tier TEXT
);
CREATE TABLE products (
  product_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  category TEXT NOT NULL,
  price REAL NOT NULL,
  stock INTEGER NOT NULL DEFAULT 0,
  supplier_id INTEGER REFERENCES suppliers(supplier_id)
);
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
  order_date DATE NOT NULL,
  status TEXT NOT NULL,
  shipping_cost REAL NOT NULL
);
CREATE TABLE order_items (
  order_id INTEGER NOT NULL REFERENCES orders(order_id),
  product_id INTEGER NOT NULL REFERENCES products(product_id),
  quantity INTEGER NOT NULL,
  unit_price REAL NOT NULL,
  PRIMARY KEY (order_id, product_id)
);
CREATE TABLE reviews (
  review_id INTEGER PRIMARY KEY,
  product_id INTEGER NOT NULL REFERENCES products(product_id),
  customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
  rating INTEGER NOT NULL,
  review_date DATE NOT NULL
);
"""

SCHOOL_DDL = """
CREATE TABLE departments (
  dept_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  building TEXT NOT NULL,
  budget REAL NOT NULL
);
CREATE TABLE teachers (
  teacher_id INTEGER PRIMARY KEY,
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  dept_id INTEGER NOT NULL REFERENCES departments(dept_id),
  "hire date" DATE NOT NULL,
  salary REAL NOT NULL
);
CREATE TABLE courses (
  course_id INTEGER PRIMARY KEY,
  "course title" TEXT NOT NULL,
  dept_id INTEGER NOT NULL REFERENCES departments(dept_id),
  teacher_id INTEGER REFERENCES teachers(teacher_id),
  "credit hours" INTEGER NOT NULL,
  level TEXT NOT NULL
);
CREATE TABLE students (
  student_id INTEGER PRIMARY KEY,
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  "grade level" INTEGER NOT NULL,
  birth_date DATE NOT NULL,
  city TEXT NOT NULL,
  email TEXT UNIQUE
);
CREATE TABLE enrollments (
  student_id INTEGER NOT NULL REFERENCES students(student_id),
  course_id INTEGER NOT NULL REFERENCES courses(course_id),
  term TEXT NOT NULL,
  "final grade" REAL,
  PRIMARY KEY (student_id, course_id, term)
);
"""


def fill_shop(con: sqlite3.Connection, rng: random.Random) -> None:
    """Suppliers, 400 customers, 64 products, 1500 orders with items, 900 reviews."""
    con.executemany(
        "INSERT INTO suppliers VALUES (?, ?, ?)",
        [(i + 1, n, c) for i, (n, c) in enumerate(SUPPLIERS)],
    )
    customers = []
    for cid in range(1, 401):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        city, country = rng.choice(CITIES)
        tier = rng.choice((None, None, "bronze", "bronze", "silver", "gold"))
        signup = _day(rng, dt.date(2021, 1, 1), dt.date(2024, 6, 30))
        customers.append(
            (cid, first, last, _email(first, last, cid, "example.com"), city, country, signup, tier)
        )
    con.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?, ?, ?)", customers)
    products = []
    for category, entries in PRODUCTS.items():
        for name, typical in entries:
            price = round(typical * rng.uniform(0.88, 1.12), 2)
            stock = rng.choice((0, rng.randrange(1, 20), rng.randrange(20, 500)))
            supplier = rng.choice((None,) + tuple(range(1, len(SUPPLIERS) + 1)) * 3)
            products.append((len(products) + 1, name, category, price, stock, supplier))
    con.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?, ?)", products)
    prices = {p[0]: p[3] for p in products}
    orders, items = [], []
    for oid in range(1, 1501):
        cust = customers[rng.randrange(len(customers))]
        start = dt.date.fromisoformat(cust[6])
        date = _day(rng, max(start, dt.date(2023, 1, 1)), dt.date(2025, 6, 30))
        shipping = rng.choice((0.0, 4.99, 4.99, 9.99, 14.5))
        orders.append((oid, cust[0], date, rng.choice(ORDER_STATUSES), shipping))
        for pid in sorted(rng.sample(sorted(prices), rng.choice((1, 1, 2, 2, 3, 4)))):
            discount = rng.choice((1.0, 1.0, 1.0, 0.9, 0.8))
            items.append(
                (oid, pid, rng.choice((1, 1, 1, 2, 2, 3, 5)), round(prices[pid] * discount, 2))
            )
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", orders)
    con.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?)", items)
    reviews = []
    for rid in range(1, 901):
        oid, pid, _, _ = items[rng.randrange(len(items))]
        order = orders[oid - 1]
        when = dt.date.fromisoformat(order[2]) + dt.timedelta(days=rng.randrange(3, 60))
        rating = rng.choices((1, 2, 3, 4, 5), weights=(1, 1, 2, 4, 5))[0]
        reviews.append((rid, pid, order[1], rating, when.isoformat()))
    con.executemany("INSERT INTO reviews VALUES (?, ?, ?, ?, ?)", reviews)


def fill_school(con: sqlite3.Connection, rng: random.Random) -> None:
    """8 departments, 40 teachers, 53 courses, 600 students, ~3000 enrollments."""
    con.executemany(
        "INSERT INTO departments VALUES (?, ?, ?, ?)",
        [(i + 1, *d) for i, d in enumerate(DEPARTMENTS)],
    )
    teachers = []
    for tid in range(1, 41):
        dept = (tid - 1) % len(DEPARTMENTS) + 1
        hired = _day(rng, dt.date(1998, 8, 1), dt.date(2024, 8, 31))
        salary = round(rng.uniform(48000, 98000), -2)
        teachers.append((tid, rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES), dept, hired, salary))
    con.executemany("INSERT INTO teachers VALUES (?, ?, ?, ?, ?, ?)", teachers)
    courses = []
    for dept_index, (dept_name, *_rest) in enumerate(DEPARTMENTS):
        staff = [t[0] for t in teachers if t[3] == dept_index + 1]
        for title in COURSES[dept_name]:
            level = LEVELS[2] if title.startswith(("AP ", "Calculus")) else rng.choice(LEVELS[:2])
            teacher = rng.choice(staff) if rng.random() > 0.08 else None
            courses.append(
                (
                    len(courses) + 1,
                    title,
                    dept_index + 1,
                    teacher,
                    rng.choice((2, 3, 3, 4, 5)),
                    level,
                )
            )
    con.executemany("INSERT INTO courses VALUES (?, ?, ?, ?, ?, ?)", courses)
    students = []
    for sid in range(1, 601):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        grade = rng.choice((9, 10, 11, 12))
        birth_year = 2025 - 6 - grade - rng.choice((0, 0, 1))
        birth = _day(rng, dt.date(birth_year, 1, 1), dt.date(birth_year, 12, 31))
        email = _email(first, last, sid, "students.example.edu") if rng.random() > 0.1 else None
        students.append((sid, first, last, grade, birth, rng.choice(SCHOOL_CITIES), email))
    con.executemany("INSERT INTO students VALUES (?, ?, ?, ?, ?, ?, ?)", students)
    enrollments = []
    for sid, *_ in students:
        for term in TERMS:
            for course in sorted(rng.sample(range(1, len(courses) + 1), rng.choice((0, 1, 1, 2)))):
                grade = (
                    None
                    if term == "2025-Spring" and rng.random() < 0.6
                    else round(min(100.0, max(35.0, rng.gauss(78, 11))), 1)
                )
                enrollments.append((sid, course, term, grade))
    con.executemany("INSERT INTO enrollments VALUES (?, ?, ?, ?)", enrollments)


DATABASES: dict[str, tuple[str, Callable[[sqlite3.Connection, random.Random], None], int]] = {
    "shop": (SHOP_DDL, fill_shop, 20261129),
    "school": (SCHOOL_DDL, fill_school, 20261130),
}


def build_database(name: str, out_dir: Path) -> Path:
    """Build ``<out_dir>/<name>.sqlite`` from scratch; returns its path."""
    ddl, fill, seed = DATABASES[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.sqlite"
    tmp = out_dir / f".{name}.sqlite.tmp"
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    try:
        con.execute("PRAGMA page_size = 4096")
        con.execute("PRAGMA foreign_keys = ON")
        con.executescript(ddl)
        fill(con, random.Random(seed))
        con.commit()
        violations = con.execute("PRAGMA foreign_key_check").fetchall()
        if violations:
            raise RuntimeError(f"{name}: foreign key violations {violations[:3]}")
        con.execute("VACUUM")
    finally:
        con.close()
    os.replace(tmp, target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder")
    args = parser.parse_args()
    for name in DATABASES:
        path = build_database(name, args.out)
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
