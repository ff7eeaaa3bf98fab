"""Build the project's sample SQLite databases: shop, school, library and flights.

Why: no package ships BIRD or Spider databases offline, so text-to-SQL tests, calibration and
the SQL assistant run on these four. ``library`` and ``flights`` hold real-world entities
(classic books and their authors; IATA airports, airlines and their alliances, with flight
times from great-circle distances) and generated people and events. They are small (a few
hundred to a few thousand rows per table, well under 2 MB each) but realistic: foreign keys,
dates, NULLs, composite primary keys, and column names with spaces that must be
double-quoted (``school``, ``library``, ``flights``).

The build is deterministic: one seeded ``random.Random`` per database, rows inserted in a fixed
order, the file written to a temporary name, vacuumed and renamed. With the same SQLite library
version the bytes are identical; across versions the content (``iterdump``) is.

Usage: ``python recipes/data/build_databases.py [--out DIR]`` (default: this folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
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


# -- library: real classic and modern books, five branches, members and their loans ----------
AUTHORS = (
    ("Jane Austen", "United Kingdom", 1775),
    ("Charles Dickens", "United Kingdom", 1812),
    ("Leo Tolstoy", "Russia", 1828),
    ("Fyodor Dostoevsky", "Russia", 1821),
    ("Mark Twain", "USA", 1835),
    ("Virginia Woolf", "United Kingdom", 1882),
    ("George Orwell", "United Kingdom", 1903),
    ("Ernest Hemingway", "USA", 1899),
    ("Gabriel Garcia Marquez", "Colombia", 1927),
    ("Toni Morrison", "USA", 1931),
    ("Haruki Murakami", "Japan", 1949),
    ("Agatha Christie", "United Kingdom", 1890),
    ("Isaac Asimov", "USA", 1920),
    ("Ursula K. Le Guin", "USA", 1929),
    ("Chinua Achebe", "Nigeria", 1930),
    ("Margaret Atwood", "Canada", 1939),
    ("Kazuo Ishiguro", "United Kingdom", 1954),
    ("Isabel Allende", "Chile", 1942),
    ("Umberto Eco", "Italy", 1932),
    ("Albert Camus", "France", 1913),
    ("Franz Kafka", "Czech Republic", 1883),
    ("Arthur Conan Doyle", "United Kingdom", 1859),
    ("Yuval Noah Harari", "Israel", 1976),
    ("Stephen Hawking", "United Kingdom", 1942),
    ("Carl Sagan", "USA", 1934),
    ("Mary Shelley", "United Kingdom", 1797),
)
# (title, author number in AUTHORS from 1, genre, year first published, pages)
BOOKS = (
    ("Pride and Prejudice", 1, "Romance", 1813, 432),
    ("Emma", 1, "Romance", 1815, 474),
    ("Sense and Sensibility", 1, "Romance", 1811, 409),
    ("Great Expectations", 2, "Classic", 1861, 505),
    ("Oliver Twist", 2, "Classic", 1838, 554),
    ("A Tale of Two Cities", 2, "Historical", 1859, 489),
    ("War and Peace", 3, "Historical", 1869, 1225),
    ("Anna Karenina", 3, "Romance", 1878, 864),
    ("Crime and Punishment", 4, "Classic", 1866, 671),
    ("The Brothers Karamazov", 4, "Classic", 1880, 796),
    ("Adventures of Huckleberry Finn", 5, "Adventure", 1884, 366),
    ("The Adventures of Tom Sawyer", 5, "Adventure", 1876, 274),
    ("Mrs Dalloway", 6, "Classic", 1925, 194),
    ("To the Lighthouse", 6, "Classic", 1927, 209),
    ("Nineteen Eighty-Four", 7, "Science Fiction", 1949, 328),
    ("Animal Farm", 7, "Classic", 1945, 112),
    ("The Old Man and the Sea", 8, "Classic", 1952, 127),
    ("A Farewell to Arms", 8, "Historical", 1929, 355),
    ("One Hundred Years of Solitude", 9, "Magical Realism", 1967, 417),
    ("Love in the Time of Cholera", 9, "Romance", 1985, 348),
    ("Beloved", 10, "Historical", 1987, 324),
    ("Song of Solomon", 10, "Classic", 1977, 337),
    ("Norwegian Wood", 11, "Romance", 1987, 296),
    ("Kafka on the Shore", 11, "Magical Realism", 2002, 505),
    ("1Q84", 11, "Magical Realism", 2009, 928),
    ("Murder on the Orient Express", 12, "Mystery", 1934, 256),
    ("And Then There Were None", 12, "Mystery", 1939, 272),
    ("Death on the Nile", 12, "Mystery", 1937, 333),
    ("Foundation", 13, "Science Fiction", 1951, 255),
    ("I, Robot", 13, "Science Fiction", 1950, 253),
    ("The Left Hand of Darkness", 14, "Science Fiction", 1969, 304),
    ("A Wizard of Earthsea", 14, "Fantasy", 1968, 183),
    ("Things Fall Apart", 15, "Classic", 1958, 209),
    ("The Handmaid's Tale", 16, "Science Fiction", 1985, 311),
    ("Oryx and Crake", 16, "Science Fiction", 2003, 376),
    ("Never Let Me Go", 17, "Science Fiction", 2005, 288),
    ("The Remains of the Day", 17, "Historical", 1989, 258),
    ("The Buried Giant", 17, "Fantasy", 2015, 317),
    ("The House of the Spirits", 18, "Magical Realism", 1982, 433),
    ("The Name of the Rose", 19, "Mystery", 1980, 536),
    ("The Stranger", 20, "Classic", 1942, 123),
    ("The Plague", 20, "Classic", 1947, 308),
    ("The Trial", 21, "Classic", 1925, 255),
    ("The Metamorphosis", 21, "Classic", 1915, 104),
    ("The Hound of the Baskervilles", 22, "Mystery", 1902, 256),
    ("A Study in Scarlet", 22, "Mystery", 1887, 188),
    ("Sapiens", 23, "Nonfiction", 2011, 443),
    ("Homo Deus", 23, "Nonfiction", 2015, 450),
    ("A Brief History of Time", 24, "Nonfiction", 1988, 256),
    ("Cosmos", 25, "Nonfiction", 1980, 396),
    ("Pale Blue Dot", 25, "Nonfiction", 1994, 429),
    ("Frankenstein", 26, "Science Fiction", 1818, 280),
)
BRANCHES = (
    ("Central Library", "Springfield", 1952),
    ("Riverside Branch", "Riverside", 1978),
    ("Hillcrest Branch", "Springfield", 1995),
    ("Lakeside Branch", "Fairview", 2004),
    ("Old Town Branch", "Franklin", 1931),
)
CONDITIONS = ("new", "good", "good", "good", "worn", "worn", "damaged")
MEMBERSHIPS = ("standard", "standard", "standard", "student", "student", "senior", "family")

LIBRARY_DDL = """
CREATE TABLE authors (
  author_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  country TEXT NOT NULL,
  birth_year INTEGER NOT NULL
);
CREATE TABLE books (
  book_id INTEGER PRIMARY KEY,
  title TEXT NOT NULL,
  author_id INTEGER NOT NULL REFERENCES authors(author_id),
  genre TEXT NOT NULL,
  published_year INTEGER NOT NULL,
  pages INTEGER NOT NULL
);
CREATE TABLE branches (
  branch_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  city TEXT NOT NULL,
  opened_year INTEGER NOT NULL
);
CREATE TABLE copies (
  copy_id INTEGER PRIMARY KEY,
  book_id INTEGER NOT NULL REFERENCES books(book_id),
  branch_id INTEGER NOT NULL REFERENCES branches(branch_id),
  acquired_date DATE NOT NULL,
  condition TEXT NOT NULL
);
CREATE TABLE members (
  member_id INTEGER PRIMARY KEY,
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  home_branch_id INTEGER NOT NULL REFERENCES branches(branch_id),
  join_date DATE NOT NULL,
  "membership type" TEXT NOT NULL
);
CREATE TABLE loans (
  loan_id INTEGER PRIMARY KEY,
  copy_id INTEGER NOT NULL REFERENCES copies(copy_id),
  member_id INTEGER NOT NULL REFERENCES members(member_id),
  loan_date DATE NOT NULL,
  due_date DATE NOT NULL,
  return_date DATE,
  late_fee REAL NOT NULL DEFAULT 0
);
"""


def fill_library(con: sqlite3.Connection, rng: random.Random) -> None:
    """26 authors, 52 books, 5 branches, ~150 copies, 500 members, 4000 loans (~4 % open)."""
    con.executemany(
        "INSERT INTO authors VALUES (?, ?, ?, ?)", [(i + 1, *a) for i, a in enumerate(AUTHORS)]
    )
    con.executemany(
        "INSERT INTO books VALUES (?, ?, ?, ?, ?, ?)", [(i + 1, *b) for i, b in enumerate(BOOKS)]
    )
    con.executemany(
        "INSERT INTO branches VALUES (?, ?, ?, ?)", [(i + 1, *b) for i, b in enumerate(BRANCHES)]
    )
    copies = []
    for book_id in range(1, len(BOOKS) + 1):
        for branch in sorted(rng.sample(range(1, len(BRANCHES) + 1), rng.choice((1, 2, 3, 3, 4)))):
            acquired = _day(rng, dt.date(2000, 1, 1), dt.date(2022, 12, 31))
            copies.append((len(copies) + 1, book_id, branch, acquired, rng.choice(CONDITIONS)))
    con.executemany("INSERT INTO copies VALUES (?, ?, ?, ?, ?)", copies)
    members = []
    for mid in range(1, 501):
        joined = _day(rng, dt.date(2015, 1, 1), dt.date(2024, 12, 31))
        members.append(
            (
                mid,
                rng.choice(FIRST_NAMES),
                rng.choice(LAST_NAMES),
                rng.randrange(1, len(BRANCHES) + 1),
                joined,
                rng.choice(MEMBERSHIPS),
            )
        )
    con.executemany("INSERT INTO members VALUES (?, ?, ?, ?, ?, ?)", members)
    loans = []
    for lid in range(1, 4001):
        member = members[rng.randrange(len(members))]
        start = max(dt.date.fromisoformat(member[4]), dt.date(2023, 1, 1))
        loaned = dt.date.fromisoformat(_day(rng, start, dt.date(2025, 6, 30)))
        due = loaned + dt.timedelta(days=21)
        kept = rng.choices((rng.randrange(3, 21), rng.randrange(21, 60)), weights=(4, 1))[0]
        returned = loaned + dt.timedelta(days=kept)
        open_loan = returned > dt.date(2025, 6, 30) or rng.random() < 0.03
        late = 0.0 if open_loan else round(max(0, (returned - due).days) * 0.25, 2)
        loans.append(
            (
                lid,
                rng.randrange(1, len(copies) + 1),
                member[0],
                loaned.isoformat(),
                due.isoformat(),
                None if open_loan else returned.isoformat(),
                late,
            )
        )
    con.executemany("INSERT INTO loans VALUES (?, ?, ?, ?, ?, ?, ?)", loans)


# -- flights: real airports and airlines (with alliances), hub routes, passengers, bookings --
# (IATA code, name, city, country, latitude, longitude); coordinates size flight durations.
AIRPORTS = (
    ("FRA", "Frankfurt Airport", "Frankfurt", "Germany", 50.03, 8.57),
    ("MUC", "Munich Airport", "Munich", "Germany", 48.35, 11.79),
    ("LHR", "London Heathrow", "London", "United Kingdom", 51.47, -0.45),
    ("CDG", "Paris Charles de Gaulle", "Paris", "France", 49.01, 2.55),
    ("AMS", "Amsterdam Schiphol", "Amsterdam", "Netherlands", 52.31, 4.76),
    ("MAD", "Madrid Barajas", "Madrid", "Spain", 40.47, -3.56),
    ("FCO", "Rome Fiumicino", "Rome", "Italy", 41.80, 12.25),
    ("ZRH", "Zurich Airport", "Zurich", "Switzerland", 47.46, 8.55),
    ("JFK", "John F. Kennedy International", "New York", "USA", 40.64, -73.78),
    ("ORD", "Chicago O'Hare International", "Chicago", "USA", 41.97, -87.91),
    ("LAX", "Los Angeles International", "Los Angeles", "USA", 33.94, -118.41),
    ("YYZ", "Toronto Pearson", "Toronto", "Canada", 43.68, -79.63),
    ("NRT", "Tokyo Narita", "Tokyo", "Japan", 35.77, 140.39),
    ("SIN", "Singapore Changi", "Singapore", "Singapore", 1.36, 103.99),
    ("DXB", "Dubai International", "Dubai", "United Arab Emirates", 25.25, 55.36),
    ("SYD", "Sydney Kingsford Smith", "Sydney", "Australia", -33.95, 151.18),
)
# (name, two-letter code, country, alliance or None, hubs, destinations)
AIRLINES = (
    (
        "Lufthansa",
        "LH",
        "Germany",
        "Star Alliance",
        ("FRA", "MUC"),
        "LHR CDG MAD FCO JFK ORD NRT SIN",
    ),
    (
        "British Airways",
        "BA",
        "United Kingdom",
        "oneworld",
        ("LHR",),
        "FRA MAD FCO JFK LAX SYD DXB",
    ),
    ("Air France", "AF", "France", "SkyTeam", ("CDG",), "FRA MAD FCO JFK LAX NRT"),
    ("KLM", "KL", "Netherlands", "SkyTeam", ("AMS",), "LHR MAD FCO JFK SIN"),
    ("Iberia", "IB", "Spain", "oneworld", ("MAD",), "LHR CDG FCO FRA JFK"),
    ("Delta Air Lines", "DL", "USA", "SkyTeam", ("JFK",), "LAX ORD CDG AMS LHR"),
    ("United Airlines", "UA", "USA", "Star Alliance", ("ORD",), "JFK LAX FRA YYZ NRT"),
    ("American Airlines", "AA", "USA", "oneworld", ("LAX", "JFK"), "ORD LHR MAD"),
    ("Air Canada", "AC", "Canada", "Star Alliance", ("YYZ",), "JFK ORD LHR FRA"),
    ("Japan Airlines", "JL", "Japan", "oneworld", ("NRT",), "LAX SIN SYD"),
    ("Singapore Airlines", "SQ", "Singapore", "Star Alliance", ("SIN",), "NRT SYD FRA LHR"),
    ("Emirates", "EK", "United Arab Emirates", None, ("DXB",), "LHR FRA SIN SYD JFK"),
    ("Qantas", "QF", "Australia", "oneworld", ("SYD",), "SIN LAX NRT"),
    ("Swiss", "LX", "Switzerland", "Star Alliance", ("ZRH",), "FRA LHR CDG JFK"),
    ("Eurowings", "EW", "Germany", None, ("MUC",), "FCO MAD LHR ZRH"),
)
FLIGHT_STATUSES = ("on time",) * 16 + ("delayed",) * 3 + ("cancelled",)
SEAT_CLASSES = ("economy", "premium economy", "business", "first")
NATIONALITIES = (
    "Germany United Kingdom France USA Spain Italy Netherlands Japan Canada Australia "
    "Singapore Switzerland India Brazil"
).split(" ")

FLIGHTS_DDL = """
CREATE TABLE airports (
  code TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  city TEXT NOT NULL,
  country TEXT NOT NULL
);
CREATE TABLE airlines (
  airline_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  country TEXT NOT NULL,
  alliance TEXT
);
CREATE TABLE flights (
  flight_id INTEGER PRIMARY KEY,
  flight_number TEXT NOT NULL,
  airline_id INTEGER NOT NULL REFERENCES airlines(airline_id),
  origin TEXT NOT NULL REFERENCES airports(code),
  destination TEXT NOT NULL REFERENCES airports(code),
  departure_date DATE NOT NULL,
  duration_minutes INTEGER NOT NULL,
  status TEXT NOT NULL
);
CREATE TABLE passengers (
  passenger_id INTEGER PRIMARY KEY,
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  nationality TEXT NOT NULL,
  birth_date DATE NOT NULL,
  "frequent flyer" INTEGER NOT NULL
);
CREATE TABLE bookings (
  booking_id INTEGER PRIMARY KEY,
  flight_id INTEGER NOT NULL REFERENCES flights(flight_id),
  passenger_id INTEGER NOT NULL REFERENCES passengers(passenger_id),
  seat_class TEXT NOT NULL,
  fare REAL NOT NULL,
  booked_on DATE NOT NULL
);
"""


def _minutes(a: tuple, b: tuple) -> int:
    """Block time from the great-circle distance: 40 min of taxi and climb plus 800 km/h."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a[4], a[5], b[4], b[5]))
    cos = math.sin(lat1) * math.sin(lat2) + math.cos(lat1) * math.cos(lat2) * math.cos(lon1 - lon2)
    km = 6371 * math.acos(max(-1.0, min(1.0, cos)))
    return 40 + 5 * round(km / 800 * 60 / 5)


def fill_flights(con: sqlite3.Connection, rng: random.Random) -> None:
    """16 airports, 15 airlines, 2400 flights on hub routes, 800 passengers, 6000 bookings."""
    con.executemany("INSERT INTO airports VALUES (?, ?, ?, ?)", [a[:4] for a in AIRPORTS])
    con.executemany(
        "INSERT INTO airlines VALUES (?, ?, ?, ?)",
        [(i + 1, a[0], a[2], a[3]) for i, a in enumerate(AIRLINES)],
    )
    where = {a[0]: a for a in AIRPORTS}
    routes = []  # (airline id, flight number, origin, destination)
    for i, (_, code, _, _, hubs, destinations) in enumerate(AIRLINES):
        for n, dest in enumerate(destinations.split()):
            hub = hubs[n % len(hubs)]
            out_number = 100 + 2 * n * 7
            routes.append((i + 1, f"{code}{out_number}", hub, dest))
            routes.append((i + 1, f"{code}{out_number + 1}", dest, hub))
    flights = []
    for fid in range(1, 2401):
        airline, number, origin, dest = routes[rng.randrange(len(routes))]
        when = _day(rng, dt.date(2024, 1, 1), dt.date(2025, 3, 31))
        minutes = _minutes(where[origin], where[dest]) + rng.choice((-10, -5, 0, 0, 5, 10))
        flights.append(
            (fid, number, airline, origin, dest, when, minutes, rng.choice(FLIGHT_STATUSES))
        )
    con.executemany("INSERT INTO flights VALUES (?, ?, ?, ?, ?, ?, ?, ?)", flights)
    passengers = []
    for pid in range(1, 801):
        born = _day(rng, dt.date(1945, 1, 1), dt.date(2007, 12, 31))
        passengers.append(
            (
                pid,
                rng.choice(FIRST_NAMES),
                rng.choice(LAST_NAMES),
                rng.choice(NATIONALITIES),
                born,
                int(rng.random() < 0.3),
            )
        )
    con.executemany("INSERT INTO passengers VALUES (?, ?, ?, ?, ?, ?)", passengers)
    bookings = []
    for bid in range(1, 6001):
        flight = flights[rng.randrange(len(flights))]
        long_haul = flight[6] > 360
        weights = (70, 12, 14, 4) if long_haul else (80, 0, 20, 0)
        seat = rng.choices(SEAT_CLASSES, weights=weights)[0]
        factor = {"economy": 1.0, "premium economy": 1.7, "business": 3.6, "first": 6.5}[seat]
        fare = round((60 + flight[6] * 0.9) * factor * rng.uniform(0.8, 1.3), 2)
        booked = dt.date.fromisoformat(flight[5]) - dt.timedelta(days=rng.randrange(1, 121))
        bookings.append(
            (bid, flight[0], rng.randrange(1, len(passengers) + 1), seat, fare, booked.isoformat())
        )
    con.executemany("INSERT INTO bookings VALUES (?, ?, ?, ?, ?, ?)", bookings)


DATABASES: dict[str, tuple[str, Callable[[sqlite3.Connection, random.Random], None], int]] = {
    "shop": (SHOP_DDL, fill_shop, 20261129),
    "school": (SCHOOL_DDL, fill_school, 20261130),
    "library": (LIBRARY_DDL, fill_library, 20261201),
    "flights": (FLIGHTS_DDL, fill_flights, 20261202),
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
