"""What customers ask the bookstore's support agent: the deal of a tool-call conversation.

A conversation of the demo corpus (data/demo/tool_calls.json) opens with one customer request, drawn
from a seeded `random.Random` and the service's starting state: the scenario (`index` modulo the ten
scenarios, in the corpus's order), the customer, the order, book, address or coupon it is about, and
the first user message, which the corpus records as the trajectory's task. The scripted support agent
(data/demo_builder/tool_calls.py) serves it; the bookstore environment (bookstore_env.py) deals the
same request from the same seed and judges whether the agent served it.

The draws are the corpus builder's, in its order: dealing here, then serving there, gives the corpus
byte for byte.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.environments.bookstore import CITIES, GENRES, STREETS, Bookstore

COUPON_CODES = ["SPRING10", "READMORE5", "SPRING20", "WELCOME"]


@dataclass(frozen=True)
class CustomerRequest:
    """A request and what it is about; the fields a scenario does not use stay empty."""

    scenario: str
    message: str  # the customer's first message: the trajectory's task
    customer_id: str | None = None
    order_id: str | None = None  # the order to cancel, re-address or look up (the real one behind a typo)
    mistyped_order_id: str | None = None  # the id as the customer typed it
    book_ids: tuple[str, ...] = ()
    quantity: int | None = None  # copies the customer wants
    address: dict[str, str] = field(default_factory=dict)  # the new shipping address
    genre: str | None = None
    coupon: str | None = None
    query: str | None = None  # the title word searched for


def pick_customer(
    rng: random.Random,
    store: Bookstore,
    wanted: Callable[[dict], bool] = lambda order: True,
) -> tuple[str, list[dict]]:
    """A customer id with at least one order matching `wanted` (chosen from the service's state)."""
    ids = sorted({o["customer_id"] for o in store.orders.values() if wanted(o)})
    customer_id = rng.choice(ids)
    return customer_id, [o for o in store.orders.values() if o["customer_id"] == customer_id and wanted(o)]


def request_buy(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id = rng.choice(sorted(store.customers))
    book = store.books[rng.choice(sorted(b for b, v in store.books.items() if v["stock"] > 0))]
    wanted = rng.choice([1, 1, 2, 3, 4])
    message = (
        f"Hi, I'm customer {customer_id}. I'd like to buy {wanted} "
        f"{'copy' if wanted == 1 else 'copies'} of a book by {book['author'].split()[1]}, "
        f"something like '{book['title'].split()[-1]}'."
    )
    return CustomerRequest("buy", message, customer_id, book_ids=(book["book_id"],), quantity=wanted)


def request_over_stock(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id = rng.choice(sorted(store.customers))
    book = store.books[rng.choice(sorted(b for b, v in store.books.items() if 1 <= v["stock"] <= 4))]
    wanted = book["stock"] + rng.randint(1, 5 - book["stock"]) if book["stock"] < 5 else 5
    message = (
        f"Customer {customer_id} here. Please order {wanted} copies of '{book['title']}' for my book club, "
        "I already know I want them."
    )
    return CustomerRequest("over_stock", message, customer_id, book_ids=(book["book_id"],), quantity=wanted)


def request_status(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id, _ = pick_customer(rng, store)
    return CustomerRequest("status", f"Hello, my customer id is {customer_id}. Where are my orders?", customer_id)


def request_cancel(rng: random.Random, store: Bookstore) -> CustomerRequest:
    shipped = rng.random() < 0.35
    states = ("shipped", "delivered") if shipped else ("pending", "processing")
    customer_id, orders = pick_customer(rng, store, lambda order: order["status"] in states)
    target = rng.choice(sorted(orders, key=lambda o: o["order_id"]))
    message = f"I'm {customer_id}. Please cancel order {target['order_id']}, I ordered it by mistake."
    return CustomerRequest("cancel", message, customer_id, order_id=target["order_id"])


def request_address(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id, orders = pick_customer(rng, store, lambda order: order["status"] != "cancelled")
    target = rng.choice(sorted(orders, key=lambda o: o["order_id"]))
    city, postal = rng.choice(CITIES)
    street = f"{rng.randint(10, 990)} {rng.choice(STREETS)}"
    address = {"street": street, "city": city, "postal_code": postal, "country": "USA"}
    message = (
        f"Hi, {customer_id} here. Can you send order {target['order_id']} to {address['street']}, "
        f"{address['city']} {address['postal_code']} instead?"
    )
    return CustomerRequest("address", message, customer_id, order_id=target["order_id"], address=address)


def request_browse(rng: random.Random, store: Bookstore) -> CustomerRequest:
    genre = rng.choice([g for g in GENRES if sum(b["genre"] == g for b in store.books.values()) >= 5])
    message = f"What {genre} books do you have? Show me everything and tell me the cheapest one in stock."
    return CustomerRequest("browse", message, genre=genre)


def request_coupon(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id = rng.choice(sorted(store.customers))
    books = rng.sample(sorted(b for b, v in store.books.items() if v["stock"] >= 2), 2)
    code = rng.choice(COUPON_CODES)
    message = f"I'm {customer_id}. I want one copy each of {books[0]} and {books[1]}, with coupon {code}."
    return CustomerRequest("coupon", message, customer_id, book_ids=tuple(books), quantity=1, coupon=code)


def request_return(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id, _ = pick_customer(rng, store, lambda order: order["status"] == "delivered")
    message = f"Customer {customer_id}. A book in my last delivered order arrived damaged. I want to return it."
    return CustomerRequest("return", message, customer_id)


def request_typo_id(rng: random.Random, store: Bookstore) -> CustomerRequest:
    customer_id, orders = pick_customer(rng, store)
    real = rng.choice(sorted(orders, key=lambda o: o["order_id"]))["order_id"]
    # Two digits swapped, the commonest typo; a swap that lands on a real order is shifted out of range.
    typo = real[:-2] + real[-1] + real[-2]
    if typo in store.orders:
        typo = f"O{int(real[1:]) + 100}"
    message = f"Hi, I'm {customer_id}, what's the status of order {typo}?"
    return CustomerRequest("typo_id", message, customer_id, order_id=real, mistyped_order_id=typo)


def request_invalid_page(rng: random.Random, store: Bookstore) -> CustomerRequest:
    query = rng.choice(sorted({book["title"].split()[-1] for book in store.books.values()}))
    message = f"Do you have books with '{query}' in the title? Show me page 3 of the results directly."
    return CustomerRequest("invalid_page", message, query=query)


# In the corpus's order: conversation `index` serves REQUESTS[index % len(REQUESTS)].
REQUESTS: list[Callable[[random.Random, Bookstore], CustomerRequest]] = [
    request_buy,
    request_over_stock,
    request_status,
    request_cancel,
    request_address,
    request_browse,
    request_coupon,
    request_return,
    request_typo_id,
    request_invalid_page,
]


def customer_request(index: int, rng: random.Random, store: Bookstore) -> CustomerRequest:
    """The request that opens conversation `index`, drawn from `rng` and the service's state."""
    return REQUESTS[index % len(REQUESTS)](rng, store)
