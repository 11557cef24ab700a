"""The bookstore service the tool-call conversations talk to: a catalog, customers and orders with
state, nine OpenAI-style tools over them, and the errors a real server gives (unknown ids, out of
stock, invalid coupons, shipped orders, bad arguments, out-of-range pages)."""

import random
from typing import Any

GENRES = ["children", "cooking", "fiction", "history", "mystery", "poetry", "science"]
TITLE_ADJECTIVES = ["Silent", "Glass", "Hidden", "Last", "Northern", "Paper", "Quiet", "Salt", "Winter", "Golden"]
TITLE_NOUNS = ["Orchard", "Harbor", "Lantern", "Archive", "Garden", "Compass", "River", "Kitchen", "Atlas", "Tide"]
AUTHOR_FIRST = ["Amara", "Bea", "Carlos", "Dmitri", "Elif", "Femi", "Greta", "Hiro", "Ines", "Jonas", "Kamala", "Luca"]
AUTHOR_LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Reyes", "Novak", "Haddad", "Brennan", "Sato", "Varga"]
CITIES = [("Portland", "97205"), ("Austin", "78701"), ("Denver", "80202"), ("Columbus", "43215"), ("Raleigh", "27601")]
STREETS = ["Maple Avenue", "Harbor Street", "Oak Lane", "Mill Road", "Cedar Court", "Elm Street"]
COUPONS = {"SPRING10": ("percent", 10), "READMORE5": ("amount", 5)}
ORDER_STATUSES = ["pending", "processing", "shipped", "delivered", "cancelled"]
RETURN_REASONS = ["damaged", "wrong item", "not as described", "changed mind"]
CANCEL_REASONS = ["no longer needed", "ordered by mistake", "found a better price", "other"]
PAGE_SIZE_ORDERS = 3

ADDRESS_SCHEMA = {
    "type": "object",
    "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "postal_code": {"type": "string"},
        "country": {"type": "string"},
    },
    "required": ["street", "city", "postal_code", "country"],
}
PAGE = {"type": "integer", "description": "1-based page number (default 1)."}
TOOL_PARAMETERS = {
    "search_books": (
        "Search the catalog by words of the title or author, optionally within one genre. "
        "Results are sorted by title and paginated.",
        {
            "query": {"type": "string", "description": "Words to match in title or author; empty matches all."},
            "genre": {"type": "string", "enum": GENRES},
            "page": PAGE,
            "page_size": {"type": "integer", "description": "Results per page, 1-10 (default 5)."},
        },
        [],
    ),
    "get_book": (
        "Full details of one book, including price and copies in stock.",
        {"book_id": {"type": "string", "description": "Book id, e.g. 'B104'."}},
        ["book_id"],
    ),
    "get_customer": (
        "A customer's profile: name, email, membership and default shipping address.",
        {"customer_id": {"type": "string", "description": "Customer id, e.g. 'C1003'."}},
        ["customer_id"],
    ),
    "list_orders": (
        f"A customer's orders, newest first, {PAGE_SIZE_ORDERS} per page, optionally filtered by status.",
        {"customer_id": {"type": "string"}, "status": {"type": "string", "enum": ORDER_STATUSES}, "page": PAGE},
        ["customer_id"],
    ),
    "get_order": (
        "One order with its items, total, status and shipping address.",
        {"order_id": {"type": "string", "description": "Order id, e.g. 'O2017'."}},
        ["order_id"],
    ),
    "create_order": (
        "Place an order for the customer, shipped to their default address. Needs the customer's "
        "explicit confirmation first. At most 5 copies per title.",
        {
            "customer_id": {"type": "string"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"book_id": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["book_id", "quantity"],
                },
            },
            "coupon_code": {"type": "string", "description": "Optional discount code."},
        },
        ["customer_id", "items"],
    ),
    "cancel_order": (
        "Cancel an order that has not shipped yet; its copies go back into stock.",
        {"order_id": {"type": "string"}, "reason": {"type": "string", "enum": CANCEL_REASONS}},
        ["order_id", "reason"],
    ),
    "update_shipping_address": (
        "Change the shipping address of an order that has not shipped yet.",
        {"order_id": {"type": "string"}, "address": ADDRESS_SCHEMA},
        ["order_id", "address"],
    ),
    "request_return": (
        "Open a return for one title of a delivered order; the refund goes to the original payment.",
        {
            "order_id": {"type": "string"},
            "book_id": {"type": "string"},
            "reason": {"type": "string", "enum": RETURN_REASONS},
        },
        ["order_id", "book_id", "reason"],
    ),
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
    for name, (description, properties, required) in TOOL_PARAMETERS.items()
]
TOOLS_BY_NAME: dict[str, dict[str, Any]] = {tool["function"]["name"]: tool["function"] for tool in TOOLS}
JSON_TYPES = {"string": str, "integer": int, "array": list, "object": dict}


class ToolError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def isbn13(rng: random.Random) -> str:
    digits = [9, 7, 8] + [rng.randint(0, 9) for _ in range(9)]
    check = (10 - sum(d * (1 if i % 2 == 0 else 3) for i, d in enumerate(digits)) % 10) % 10
    return "".join(map(str, digits + [check]))


def check_arguments(schema: dict, value: Any, where: str) -> None:
    """Validate arguments against the tool's JSON schema (the subset the tools use), as a server
    would: a missing, unknown or mistyped argument is an `invalid_arguments` error."""
    expected = schema.get("type")
    # bool is an int subclass in Python, but `true` is no integer in JSON Schema.
    if expected and (
        not isinstance(value, JSON_TYPES[expected]) or (expected == "integer" and isinstance(value, bool))
    ):
        raise ToolError("invalid_arguments", f"{where}: expected {expected}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError("invalid_arguments", f"{where}: must be one of {', '.join(schema['enum'])}")
    if expected == "object":
        for name in schema.get("required", []):
            if name not in value:
                raise ToolError("invalid_arguments", f"{where}: missing required field '{name}'")
        for name in value:
            if name not in schema["properties"]:
                raise ToolError("invalid_arguments", f"{where}: unknown field '{name}'")
            check_arguments(schema["properties"][name], value[name], f"{where}.{name}")
    if expected == "array":
        for position, item in enumerate(value):
            check_arguments(schema["items"], item, f"{where}[{position}]")


class Bookstore:
    """The service behind the tools: a catalog, customers and orders, all built from one seed so
    every trajectory starts from the same state, and changed by the calls it receives."""

    def __init__(self) -> None:
        rng = random.Random("bookstore")
        self.books: dict[str, dict] = {}
        titles = sorted({f"The {a} {n}" for a in TITLE_ADJECTIVES for n in TITLE_NOUNS})
        for number, title in enumerate(rng.sample(titles, 40), start=101):
            self.books[f"B{number}"] = {
                "book_id": f"B{number}",
                "title": title,
                "author": f"{rng.choice(AUTHOR_FIRST)} {rng.choice(AUTHOR_LAST)}",
                "genre": rng.choice(GENRES),
                "price": round(rng.randint(799, 3499) / 100, 2),
                "isbn": isbn13(rng),
                "year": rng.randint(1961, 2023),
                "stock": rng.choice([0, 1, 2, 3, 4, 6, 8, 12]),
            }
        self.customers: dict[str, dict] = {}
        for number in range(1001, 1013):
            first, last = rng.choice(AUTHOR_FIRST), rng.choice(AUTHOR_LAST)
            city, postal = rng.choice(CITIES)
            self.customers[f"C{number}"] = {
                "customer_id": f"C{number}",
                "name": f"{first} {last}",
                "email": f"{first.lower()}.{last.lower()}{number % 100}@example.com",
                "membership": rng.choice(["standard", "standard", "gold"]),
                "address": {
                    "street": f"{rng.randint(10, 990)} {rng.choice(STREETS)}",
                    "city": city,
                    "postal_code": postal,
                    "country": "USA",
                },
            }
        self.orders: dict[str, dict] = {}
        self.returns = 0
        for number in range(2001, 2041):
            customer = self.customers[rng.choice(sorted(self.customers))]
            items = [
                {"book_id": book_id, "quantity": rng.randint(1, 2)}
                for book_id in rng.sample(sorted(self.books), rng.randint(1, 3))
            ]
            self._store_order(
                f"O{number}",
                customer,
                items,
                None,
                rng.choice(["pending", "processing", "shipped", "delivered", "delivered", "cancelled"]),
                f"2024-{3 + (number - 2001) // 30:02d}-{(number - 2001) % 30 + 1:02d}",
            )
        self.next_order = 2041

    def _store_order(
        self, order_id: str, customer: dict, items: list[dict], coupon: str | None, status: str, placed_on: str
    ) -> dict:
        lines = [
            {
                "book_id": item["book_id"],
                "title": self.books[item["book_id"]]["title"],
                "quantity": item["quantity"],
                "unit_price": self.books[item["book_id"]]["price"],
            }
            for item in items
        ]
        subtotal = round(sum(line["unit_price"] * line["quantity"] for line in lines), 2)
        discount = 0.0
        if coupon is not None:
            kind, amount = COUPONS[coupon]
            discount = round(subtotal * amount / 100, 2) if kind == "percent" else float(min(amount, subtotal))
        order = {
            "order_id": order_id,
            "customer_id": customer["customer_id"],
            "status": status,
            "placed_on": placed_on,
            "items": lines,
            "subtotal": subtotal,
            "discount": discount,
            "total": round(subtotal - discount, 2),
            "shipping_address": dict(customer["address"]),
        }
        self.orders[order_id] = order
        return order

    def call(self, name: str, arguments: dict) -> object:
        """A tool call as the server answers it: the result, or `{"error": {code, message}}`."""
        try:
            if name not in TOOLS_BY_NAME:
                raise ToolError("unknown_tool", f"no tool named '{name}'")
            check_arguments(TOOLS_BY_NAME[name]["parameters"], arguments, "arguments")
            return getattr(self, name)(**arguments)
        except ToolError as error:
            return {"error": {"code": error.code, "message": str(error)}}

    def _book(self, book_id: str) -> dict:
        if book_id not in self.books:
            raise ToolError("not_found", f"book '{book_id}' not found")
        return self.books[book_id]

    def _customer(self, customer_id: str) -> dict:
        if customer_id not in self.customers:
            raise ToolError("not_found", f"customer '{customer_id}' not found")
        return self.customers[customer_id]

    def _order(self, order_id: str) -> dict:
        if order_id not in self.orders:
            raise ToolError("not_found", f"order '{order_id}' not found")
        return self.orders[order_id]

    @staticmethod
    def _page(rows: list, page: int, page_size: int, key: str) -> dict:
        pages = max(1, -(-len(rows) // page_size))
        if page < 1 or page > pages:
            raise ToolError("invalid_page", f"page {page} is out of range (1-{pages})")
        start = (page - 1) * page_size
        return {key: rows[start : start + page_size], "page": page, "total_pages": pages, "total_results": len(rows)}

    def search_books(self, query: str = "", genre: str | None = None, page: int = 1, page_size: int = 5) -> dict:
        if not 1 <= page_size <= 10:
            raise ToolError("invalid_arguments", "page_size must be between 1 and 10")
        words = query.lower().split()
        hits = [
            {key: book[key] for key in ("book_id", "title", "author", "genre", "price")}
            for book in sorted(self.books.values(), key=lambda b: (b["title"], b["book_id"]))
            if (genre is None or book["genre"] == genre)
            and all(word in f"{book['title']} {book['author']}".lower() for word in words)
        ]
        return self._page(hits, page, page_size, "results")

    def get_book(self, book_id: str) -> dict:
        return dict(self._book(book_id))

    def get_customer(self, customer_id: str) -> dict:
        return self._customer(customer_id)

    def list_orders(self, customer_id: str, status: str | None = None, page: int = 1) -> dict:
        self._customer(customer_id)
        rows = [
            {key: order[key] for key in ("order_id", "status", "placed_on", "total")}
            for order in sorted(self.orders.values(), key=lambda o: o["order_id"], reverse=True)
            if order["customer_id"] == customer_id and status in (None, order["status"])
        ]
        return self._page(rows, page, PAGE_SIZE_ORDERS, "orders")

    def get_order(self, order_id: str) -> dict:
        return self._order(order_id)

    def create_order(self, customer_id: str, items: list[dict], coupon_code: str | None = None) -> dict:
        customer = self._customer(customer_id)
        if not items:
            raise ToolError("invalid_arguments", "items must not be empty")
        for item in items:
            book = self._book(item["book_id"])
            if not 1 <= item["quantity"] <= 5:
                raise ToolError("invalid_quantity", f"quantity for '{book['book_id']}' must be between 1 and 5")
            if item["quantity"] > book["stock"]:
                raise ToolError(
                    "insufficient_stock",
                    f"only {book['stock']} copies of '{book['book_id']}' in stock, {item['quantity']} requested",
                )
        if coupon_code is not None and coupon_code not in COUPONS:
            raise ToolError("invalid_coupon", f"coupon '{coupon_code}' is not valid")
        for item in items:
            self.books[item["book_id"]]["stock"] -= item["quantity"]
        order_id = f"O{self.next_order}"
        self.next_order += 1
        return self._store_order(order_id, customer, items, coupon_code, "pending", "2024-05-15")

    def _unshipped(self, order_id: str, verb: str) -> dict:
        order = self._order(order_id)
        if order["status"] not in ("pending", "processing"):
            raise ToolError("invalid_status", f"order '{order_id}' is {order['status']} and cannot be {verb}")
        return order

    def cancel_order(self, order_id: str, reason: str) -> dict:
        order = self._unshipped(order_id, "cancelled")
        for line in order["items"]:
            self.books[line["book_id"]]["stock"] += line["quantity"]
        order["status"] = "cancelled"
        return {"order_id": order_id, "status": "cancelled", "reason": reason, "refund_amount": order["total"]}

    def update_shipping_address(self, order_id: str, address: dict) -> dict:
        order = self._unshipped(order_id, "re-addressed")
        # Stored in the schema's field order, as a server with a typed address model keeps it: the reply
        # does not echo the order the caller's JSON happened to list the fields in (a call rendered with
        # sorted keys, as ingestion renders actions, gets the reply the corpus's agent got).
        order["shipping_address"] = {key: address[key] for key in ADDRESS_SCHEMA["properties"]}
        return {"order_id": order_id, "status": order["status"], "shipping_address": order["shipping_address"]}

    def request_return(self, order_id: str, book_id: str, reason: str) -> dict:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError(
                "invalid_status", f"order '{order_id}' is {order['status']}; only delivered orders can be returned"
            )
        line = next((line for line in order["items"] if line["book_id"] == book_id), None)
        if line is None:
            raise ToolError("not_found", f"book '{book_id}' is not in order '{order_id}'")
        self.returns += 1
        return {
            "return_id": f"R{order_id[1:]}-{self.returns}",
            "order_id": order_id,
            "book_id": book_id,
            "reason": reason,
            "refund_amount": round(line["unit_price"] * line["quantity"], 2),
            "status": "return_label_sent",
        }
