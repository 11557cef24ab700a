"""The bookstore tool service as a gymnasium environment (issue 31, deliver 2): a customer's request,
dealt as the corpus deals it (bookstore_requests.py), served by tool calls to the real service.

    env = BookstoreEnv()
    observation, info = env.reset(seed=0)   # info["task"]: "Hi, I'm customer C1003. I'd like to buy 2 copies ..."
    observation, reward, terminated, truncated, info = env.step(
        '{"name": "get_customer", "arguments": {"customer_id": "C1003"}}')

Conversation `index` opens with request `index` (scenario `index` modulo 10), drawn from
`random.Random(f"tool-calls-{index}")` and a fresh service, as data/demo_builder/tool_calls.py draws
it. (The builder redraws a conversation whose calls and replies repeat an earlier one's, 9 of 120: a
de-duplication of its agent's runs, not of the requests; here task `index` is always the first draw.)

As data/demo/tool_calls.json presents a conversation once ingested (pipeline/formats/openai_chat.py):
domain `mcp`, the task the customer's first message, the system prompt's one part the tools; the
support agent's own system prompt is the agent's, not the environment's, and the customer's later
messages are not environment turns. An action is a tool call as the corpus renders it,
`{"name": ..., "arguments": {...}}` (pipeline/formats/tool_calls.py), and the observation the
service's JSON reply, errors included. An action that is not such a call answers an `invalid_call`
error, as a tool server answers a malformed request.

Success is the request served, read from the replies (`BookstoreGoal`s below): the order placed for
the right books and quantities, the order cancelled or re-addressed (or the service's refusal, for an
order that has shipped), the return opened, the customer's order listed and shown, the whole genre
listed and its cheapest book in stock looked up, the searched word's results shown. A goal never
depends on what the service makes up at run time (a new order's id and date, a return's id).

The solution is planned against a scratch copy of the service (its answers are the ground truth:
which page holds what, which coupon is valid), the calls a careful support agent makes. The
vocabulary is the nine tools over this store's customers, orders and books.
"""

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.environments.base import RealEnvironment
from pipeline.environments.bookstore import COUPONS, GENRES, TOOLS, Bookstore
from pipeline.environments.bookstore_requests import CustomerRequest, customer_request
from pipeline.environments.task import History, TaskSpec
from pipeline.formats.tool_calls import render_call
from pipeline.store.schema import SystemPrompt

DOMAIN = "mcp"
# The corpus's conversations make at most 10 calls.
MAX_STEPS = 10
# The corpus agent's page size when it lists a genre.
GENRE_PAGE_SIZE = 4


def tool_calls(history: History) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(tool, arguments, reply) of every step whose action is a rendered call and whose reply is JSON."""
    for action, observation in history:
        try:
            call, reply = json.loads(action), json.loads(observation)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict):
            yield call["name"], call["arguments"], reply


def answered(history: History, tool: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(arguments, reply) of the calls of `tool` that the service answered without an error."""
    for name, arguments, reply in tool_calls(history):
        if name == tool and isinstance(reply, dict) and "error" not in reply:
            yield arguments, reply


def order_lines(reply: dict[str, Any]) -> list[tuple[Any, Any]]:
    items = reply.get("items")
    lines = items if isinstance(items, list) else []
    return sorted((line.get("book_id"), line.get("quantity")) for line in lines if isinstance(line, dict))


@dataclass(frozen=True)
class OrderPlaced:
    """A new order for the customer with exactly these books and quantities (its id and date are the service's)."""

    customer_id: str
    items: tuple[tuple[str, int], ...]  # (book id, quantity), sorted
    discounted: bool  # a valid coupon was asked for: the order carries a discount

    def __call__(self, history: History) -> bool:
        return any(
            reply.get("customer_id") == self.customer_id
            and order_lines(reply) == list(self.items)
            and (not self.discounted or (isinstance(reply.get("discount"), (int, float)) and reply["discount"] > 0))
            for _, reply in answered(history, "create_order")
        )


@dataclass(frozen=True)
class OrderChanged:
    """The order cancelled (`tool` cancel_order: its status now `cancelled`) or re-addressed
    (update_shipping_address: its shipping address now the customer's new one)."""

    tool: str
    order_id: str
    address: dict[str, str] = field(default_factory=dict)

    def __call__(self, history: History) -> bool:
        for _, reply in answered(history, self.tool):
            if reply.get("order_id") != self.order_id:
                continue
            if self.tool == "cancel_order" and reply.get("status") == "cancelled":
                return True
            if self.tool == "update_shipping_address" and reply.get("shipping_address") == self.address:
                return True
        return False


@dataclass(frozen=True)
class OrderRefused:
    """The change asked of an order that has shipped, tried and refused by the service (`invalid_status`):
    what can be done for the customer, who is then told so."""

    tool: str
    order_id: str

    def __call__(self, history: History) -> bool:
        return any(
            name == self.tool
            and arguments.get("order_id") == self.order_id
            and isinstance(reply, dict)
            and isinstance(reply.get("error"), dict)
            and reply["error"].get("code") == "invalid_status"
            for name, arguments, reply in tool_calls(history)
        )


@dataclass(frozen=True)
class OrderShown:
    """The customer's orders listed and the one asked about (the newest, or the real one behind a typo) shown."""

    customer_id: str
    order_id: str

    def __call__(self, history: History) -> bool:
        listed = any(
            arguments.get("customer_id") == self.customer_id for arguments, _ in answered(history, "list_orders")
        )
        shown = any(reply.get("order_id") == self.order_id for _, reply in answered(history, "get_order"))
        return listed and shown


@dataclass(frozen=True)
class ReturnOpened:
    """A return opened for a book of the order (its return id is the service's)."""

    order_id: str

    def __call__(self, history: History) -> bool:
        return any(
            reply.get("order_id") == self.order_id and reply.get("status") == "return_label_sent"
            for _, reply in answered(history, "request_return")
        )


@dataclass(frozen=True)
class GenreListed:
    """Every book of the genre seen in search results, and the cheapest one in stock looked up (in stock)."""

    genre: str
    book_ids: tuple[str, ...]
    cheapest_in_stock: str

    def __call__(self, history: History) -> bool:
        seen = {
            hit.get("book_id")
            for arguments, reply in answered(history, "search_books")
            if arguments.get("genre") == self.genre and isinstance(reply.get("results"), list)
            for hit in reply["results"]
            if isinstance(hit, dict)
        }
        looked_up = any(
            reply.get("book_id") == self.cheapest_in_stock
            and isinstance(reply.get("stock"), int)
            and reply["stock"] > 0
            for _, reply in answered(history, "get_book")
        )
        return set(self.book_ids) <= seen and looked_up


@dataclass(frozen=True)
class ResultsShown:
    """A search for the word answered with results, and one of those results looked up."""

    query: str

    def __call__(self, history: History) -> bool:
        found: set[Any] = set()
        for name, arguments, reply in tool_calls(history):
            if not isinstance(reply, dict) or "error" in reply:
                continue
            if (
                name == "search_books"
                and arguments.get("query") == self.query
                and isinstance(reply.get("results"), list)
            ):
                found |= {hit.get("book_id") for hit in reply["results"] if isinstance(hit, dict)}
            elif name == "get_book" and reply.get("book_id") in found:
                return True
        return False


BookstoreGoal = OrderPlaced | OrderChanged | OrderRefused | OrderShown | ReturnOpened | GenreListed | ResultsShown


class Planner:
    """The solution's calls, each tried on a scratch copy of the service so the plan knows its answers."""

    def __init__(self) -> None:
        self.store = Bookstore()
        self.calls: list[str] = []

    def call(self, name: str, **arguments: Any) -> Any:
        self.calls.append(render_call(name, arguments))
        return self.store.call(name, arguments)


def newest_order(store: Bookstore, customer_id: str, status: str | None = None) -> str:
    """The first order `list_orders` shows the customer: the highest id (the service lists newest first)."""
    return max(
        o["order_id"]
        for o in store.orders.values()
        if o["customer_id"] == customer_id and status in (None, o["status"])
    )


def unshipped(store: Bookstore, order_id: str) -> bool:
    return store.orders[order_id]["status"] in ("pending", "processing")


def goal_and_solution(request: CustomerRequest) -> tuple[BookstoreGoal, list[str]]:
    """What serving the request means, and the calls that serve it."""
    plan = Planner()
    store = plan.store
    customer = request.customer_id or ""
    goal: BookstoreGoal
    if request.scenario in ("buy", "over_stock"):
        book = store.books[request.book_ids[0]]
        quantity = min(request.quantity or 1, book["stock"])
        if request.scenario == "buy":
            plan.call("get_customer", customer_id=customer)
            plan.call("search_books", query=book["author"].split()[1])
        else:
            plan.call("search_books", query=book["title"])
        plan.call("get_book", book_id=book["book_id"])
        plan.call("create_order", customer_id=customer, items=[{"book_id": book["book_id"], "quantity": quantity}])
        goal = OrderPlaced(customer, ((book["book_id"], quantity),), discounted=False)
    elif request.scenario == "coupon":
        for book_id in request.book_ids:
            plan.call("get_book", book_id=book_id)
        items = [{"book_id": book_id, "quantity": 1} for book_id in request.book_ids]
        order = plan.call("create_order", customer_id=customer, items=items, coupon_code=request.coupon)
        if "error" in order:  # an invalid coupon: the customer, told so, takes the order without it
            plan.call("create_order", customer_id=customer, items=items)
        goal = OrderPlaced(customer, tuple(sorted((b, 1) for b in request.book_ids)), request.coupon in COUPONS)
    elif request.scenario in ("cancel", "address"):
        order_id = request.order_id or ""
        possible = unshipped(store, order_id)
        plan.call("get_customer", customer_id=customer)
        plan.call("get_order", order_id=order_id)
        if request.scenario == "cancel":
            plan.call("cancel_order", order_id=order_id, reason="ordered by mistake")
            goal = OrderChanged("cancel_order", order_id) if possible else OrderRefused("cancel_order", order_id)
        else:
            plan.call("update_shipping_address", order_id=order_id, address=dict(request.address))
            tool = "update_shipping_address"
            goal = OrderChanged(tool, order_id, dict(request.address)) if possible else OrderRefused(tool, order_id)
    elif request.scenario == "status":
        order_id = newest_order(store, customer)
        plan.call("get_customer", customer_id=customer)
        plan.call("list_orders", customer_id=customer)
        plan.call("get_order", order_id=order_id)
        goal = OrderShown(customer, order_id)
    elif request.scenario == "typo_id":
        order_id = request.order_id or ""
        plan.call("get_order", order_id=request.mistyped_order_id)
        plan.call("list_orders", customer_id=customer)
        plan.call("get_order", order_id=order_id)
        goal = OrderShown(customer, order_id)
    elif request.scenario == "return":
        order_id = newest_order(store, customer, "delivered")
        plan.call("list_orders", customer_id=customer, status="delivered")
        order = plan.call("get_order", order_id=order_id)
        plan.call("request_return", order_id=order_id, book_id=order["items"][0]["book_id"], reason="damaged")
        goal = ReturnOpened(order_id)
    elif request.scenario == "browse":
        genre = request.genre or ""
        books = sorted(
            (b for b in store.books.values() if b["genre"] == genre), key=lambda b: (b["price"], b["book_id"])
        )
        page, pages = 1, 1
        while page <= pages:
            listing = plan.call(
                "search_books", genre=genre, page_size=GENRE_PAGE_SIZE, **({"page": page} if page > 1 else {})
            )
            pages, page = listing["total_pages"], page + 1
        cheapest = next(b["book_id"] for b in books if b["stock"] > 0)
        plan.call("get_book", book_id=cheapest)
        goal = GenreListed(genre, tuple(sorted(b["book_id"] for b in books)), cheapest)
    elif request.scenario == "invalid_page":
        query = request.query or ""
        results = plan.call("search_books", query=query, page=3)
        if "error" in results:  # fewer than 3 pages: the first one, then
            results = plan.call("search_books", query=query)
        plan.call("get_book", book_id=results["results"][0]["book_id"])
        goal = ResultsShown(query)
    else:
        raise ValueError(f"unknown bookstore scenario {request.scenario!r}")
    return goal, plan.calls


def vocabulary(store: Bookstore, request: CustomerRequest, rng: random.Random) -> list[str]:
    """The nine tools over every customer, some orders (the customer's among them) and some books (the request's)."""
    customers = sorted(store.customers)
    own = sorted(o for o, order in store.orders.items() if order["customer_id"] == request.customer_id)
    orders = sorted(set(own) | set(rng.sample(sorted(store.orders), 5)))
    books = sorted(set(request.book_ids) | set(rng.sample(sorted(store.books), 6)))
    words = sorted(
        {book["author"].split()[1] for book in store.books.values()}
        | {book["title"].split()[-1] for book in store.books.values()}
    )
    calls: list[tuple[str, dict[str, Any]]] = [("get_customer", {"customer_id": c}) for c in customers]
    calls += [("list_orders", {"customer_id": c}) for c in customers]
    for order_id in orders:
        order = store.orders[order_id]
        address = store.customers[order["customer_id"]]["address"]
        calls += [
            ("get_order", {"order_id": order_id}),
            ("cancel_order", {"order_id": order_id, "reason": "other"}),
            ("update_shipping_address", {"order_id": order_id, "address": dict(address)}),
            ("request_return", {"order_id": order_id, "book_id": order["items"][0]["book_id"], "reason": "damaged"}),
        ]
    calls += [("get_book", {"book_id": b}) for b in books]
    calls += [("search_books", {"query": w}) for w in rng.sample(words, 6)]
    calls += [("search_books", {"genre": g}) for g in GENRES]
    calls += [
        ("create_order", {"customer_id": request.customer_id or customers[0], "items": [{"book_id": b, "quantity": 1}]})
        for b in rng.sample(books, 4)
    ]
    return [render_call(name, arguments) for name, arguments in calls]


def bookstore_deal(index: int) -> tuple[Bookstore, CustomerRequest, TaskSpec]:
    store = Bookstore()
    request = customer_request(index, random.Random(f"tool-calls-{index}"), store)
    goal, solution = goal_and_solution(request)
    spec = TaskSpec(
        domain=DOMAIN,
        task=request.message,
        system=SystemPrompt(tools=TOOLS),
        success=goal,
        solution=tuple(solution),
        vocabulary=tuple(vocabulary(store, request, random.Random(f"bookstore-vocabulary-{index}"))),
        max_steps=MAX_STEPS,
    )
    return store, request, spec


def bookstore_task(index: int) -> TaskSpec:
    """Task `index` as the corpus deals it (conversation `index` of the corpus, but for its 9 redraws)."""
    return bookstore_deal(index)[2]


def invalid_call(message: str) -> str:
    return json.dumps({"error": {"code": "invalid_call", "message": message}})


class BookstoreEnv(RealEnvironment):
    store: Bookstore
    request: CustomerRequest

    def deal(self, index: int) -> TaskSpec:
        self.store, self.request, spec = bookstore_deal(index)
        return spec

    def run(self, action: str) -> tuple[str, dict[str, Any]]:
        try:
            call = json.loads(action)
        except ValueError:
            return invalid_call('the action is not JSON: expected {"name": ..., "arguments": {...}}'), {}
        if not (
            isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments", {}), dict)
        ):
            return invalid_call('expected {"name": <tool>, "arguments": {...}}'), {}
        return json.dumps(self.store.call(call["name"], call.get("arguments", {}))), {"tool": call["name"]}
