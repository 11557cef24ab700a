"""Tool-call conversations: a scripted support agent serves customers of the bookstore, each
conversation one scenario (buy, cancel, return, ...; the customer's request is dealt by
pipeline/environments/bookstore_requests.py) and maybe a follow-up request, in OpenAI chat format;
every tool response is what the live service returned."""

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.environments.bookstore import GENRES, TOOLS, Bookstore
from pipeline.environments.bookstore_requests import CustomerRequest, customer_request

from .verifiers import json_keys_verifier

BOOKSTORE_POLICY = (
    "You are the customer support agent of Inkwell Books, an online bookstore. Help customers find books, "
    "place orders, check order status, change shipping addresses, cancel orders and open returns, using only "
    "the tools provided. Identify the customer by customer id before acting on their account. Before any call "
    "that changes an order (create, cancel, address change, return), state the details and get the customer's "
    "explicit confirmation. Orders that have shipped cannot be cancelled or re-addressed. Do not make up "
    "information the tools did not return."
)
# OpenAI's tool-call ids look like `call_` and 24 letters and digits; these are drawn from the seed.
CALL_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass
class ToolConversation:
    """An OpenAI-format conversation whose tool calls are executed against a live Bookstore."""

    rng: random.Random
    store: Bookstore
    messages: list[dict] = field(default_factory=list)
    calls: int = 0

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def call(self, name: str, **arguments: object) -> dict:
        return self.parallel((name, arguments))[0]

    def parallel(self, *calls: tuple[str, dict]) -> list[dict]:
        ids = ["call_" + "".join(self.rng.choices(CALL_ID_ALPHABET, k=24)) for _ in calls]
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                    for call_id, (name, arguments) in zip(ids, calls)
                ],
            }
        )
        results = []
        for call_id, (name, arguments) in zip(ids, calls):
            result = self.store.call(name, arguments)
            # Every reply is a JSON object whose keys the service fixes: the rule reward checks them.
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": name,
                    "content": json.dumps(result),
                    "verifier": json_keys_verifier(list(result)),
                }
            )
            results.append(result)
        self.calls += len(calls)
        return results


def money(value: float) -> str:
    return f"${value:.2f}"


def customer_orders(chat: ToolConversation, customer_id: str, status: str | None = None) -> list[dict]:
    """Page through list_orders the way an agent does: ask for the next page while there is one."""
    rows, page = [], 1
    while True:
        arguments = {"customer_id": customer_id, **({"status": status} if status else {})}
        listing = chat.call("list_orders", **arguments, **({"page": page} if page > 1 else {}))
        rows += listing["orders"]
        if page >= listing["total_pages"]:
            return rows
        page += 1


def scenario_buy(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id, book, wanted = request.customer_id, chat.store.books[request.book_ids[0]], request.quantity
    customer = chat.call("get_customer", customer_id=customer_id)
    query = book["author"].split()[1]
    page, found = 1, None
    while found is None:
        results = chat.call("search_books", query=query, page_size=3, **({"page": page} if page > 1 else {}))
        found = next((hit for hit in results["results"] if hit["book_id"] == book["book_id"]), None)
        page += 1
    details = chat.call("get_book", book_id=found["book_id"])
    quantity = wanted
    if details["stock"] < wanted:
        chat.say(
            f"'{details['title']}' is {money(details['price'])}, but only {details['stock']} "
            f"{'copy is' if details['stock'] == 1 else 'copies are'} in stock. Would you like those?"
        )
        chat.user("Yes, I'll take what you have.")
        quantity = details["stock"]
    address = customer["address"]
    chat.say(
        f"To confirm: {quantity} x '{details['title']}' by {details['author']} at {money(details['price'])} each, "
        f"shipped to {address['street']}, {address['city']}. Shall I place the order?"
    )
    chat.user("Yes, please.")
    items = [{"book_id": details["book_id"], "quantity": quantity}]
    order = chat.call("create_order", customer_id=customer_id, items=items)
    chat.say(f"Done: order {order['order_id']} is placed, total {money(order['total'])}.")
    return customer_id


def scenario_over_stock(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id, book, wanted = request.customer_id, chat.store.books[request.book_ids[0]], request.quantity
    chat.call("search_books", query=book["title"])
    items = [{"book_id": book["book_id"], "quantity": wanted}]
    failed = chat.call("create_order", customer_id=customer_id, items=items)
    details = chat.call("get_book", book_id=book["book_id"])
    chat.say(
        f"The order did not go through: {failed['error']['message']}. I can order the {details['stock']} "
        "available copies instead. Shall I?"
    )
    chat.user("OK, go ahead with those.")
    items = [{"book_id": book["book_id"], "quantity": details["stock"]}]
    order = chat.call("create_order", customer_id=customer_id, items=items)
    chat.say(f"Order {order['order_id']} is placed for {details['stock']} copies, total {money(order['total'])}.")
    return customer_id


def scenario_status(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id = request.customer_id
    chat.call("get_customer", customer_id=customer_id)
    rows = customer_orders(chat, customer_id)
    order = chat.call("get_order", order_id=rows[0]["order_id"])
    titles = ", ".join(f"'{line['title']}'" for line in order["items"])
    others = "; ".join(f"{row['order_id']} is {row['status']}" for row in rows[1:]) or "no other orders"
    chat.say(
        f"Your latest order {order['order_id']} ({titles}) is {order['status']}, placed on "
        f"{order['placed_on']}. Other orders: {others}."
    )
    return customer_id


def scenario_cancel(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id = request.customer_id
    chat.call("get_customer", customer_id=customer_id)
    order = chat.call("get_order", order_id=request.order_id)
    chat.say(
        f"Order {order['order_id']} ({len(order['items'])} item(s), {money(order['total'])}) will be cancelled "
        "with reason 'ordered by mistake'. Confirm?"
    )
    chat.user("Yes, cancel it.")
    result = chat.call("cancel_order", order_id=order["order_id"], reason="ordered by mistake")
    if "error" in result:
        chat.say(
            f"I could not cancel it: the order is already {order['status']}. Once it is delivered you can "
            "open a return instead."
        )
    else:
        chat.say(f"Order {order['order_id']} is cancelled; {money(result['refund_amount'])} will be refunded.")
    return customer_id


def scenario_address(chat: ToolConversation, request: CustomerRequest) -> str | None:
    rng, customer_id, address = chat.rng, request.customer_id, request.address
    chat.call("get_customer", customer_id=customer_id)
    order = chat.call("get_order", order_id=request.order_id)
    chat.say(
        f"I'll change the shipping address of {order['order_id']} to {address['street']}, {address['city']} "
        f"{address['postal_code']}, USA. OK?"
    )
    chat.user("Yes.")
    if rng.random() < 0.4:
        partial = {key: value for key, value in address.items() if key != "postal_code"}
        chat.call("update_shipping_address", order_id=order["order_id"], address=partial)
    result = chat.call("update_shipping_address", order_id=order["order_id"], address=address)
    if "error" in result:
        chat.say(f"Sorry, that order is already {order['status']}, so its address can no longer be changed.")
    else:
        chat.say(f"Done: order {order['order_id']} will ship to {address['street']}, {address['city']}.")
        if rng.random() < 0.5:
            chat.call("get_order", order_id=order["order_id"])
            chat.say("I double-checked the order and the new address is on it.")
    return customer_id


def scenario_browse(chat: ToolConversation, request: CustomerRequest) -> str | None:
    rng, genre = chat.rng, request.genre
    hits, page = [], 1
    while True:
        results = chat.call("search_books", genre=genre, page=page, page_size=4)
        hits += results["results"]
        if page >= results["total_pages"]:
            break
        page += 1
    if rng.random() < 0.3:
        chat.call("search_books", genre=genre, page=page + 1, page_size=4)
    for hit in sorted(hits, key=lambda h: (h["price"], h["book_id"])):
        details = chat.call("get_book", book_id=hit["book_id"])
        if details["stock"] > 0 or chat.calls >= 9:
            break
    listing = "; ".join(f"'{h['title']}' ({money(h['price'])})" for h in hits)
    chat.say(
        f"We have {len(hits)} {genre} books: {listing}. The cheapest checked, '{details['title']}', has "
        f"{details['stock']} in stock."
    )
    return None


def scenario_coupon(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id, books, code = request.customer_id, request.book_ids, request.coupon
    first, second = chat.parallel(("get_book", {"book_id": books[0]}), ("get_book", {"book_id": books[1]}))
    chat.say(
        f"'{first['title']}' ({money(first['price'])}) and '{second['title']}' ({money(second['price'])}) with "
        f"coupon {code}. Place the order?"
    )
    chat.user("Yes.")
    items = [{"book_id": book_id, "quantity": 1} for book_id in books]
    order = chat.call("create_order", customer_id=customer_id, items=items, coupon_code=code)
    if "error" in order:
        chat.say(f"The coupon {code} was rejected ({order['error']['message']}). Order without it?")
        chat.user("Fine, without the coupon then.")
        order = chat.call("create_order", customer_id=customer_id, items=items)
    chat.say(f"Order {order['order_id']} placed: total {money(order['total'])} (discount {money(order['discount'])}).")
    return customer_id


def scenario_return(chat: ToolConversation, request: CustomerRequest) -> str | None:
    rng, customer_id = chat.rng, request.customer_id
    rows = customer_orders(chat, customer_id, status="delivered")
    order = chat.call("get_order", order_id=rows[0]["order_id"])
    line = rng.choice(order["items"])
    chat.say(f"Which title is damaged? The order has: {', '.join(repr(item['title']) for item in order['items'])}.")
    chat.user(f"'{line['title']}'.")
    chat.say(f"I'll open a return for '{line['title']}' from {order['order_id']} as damaged. Confirm?")
    chat.user("Confirmed.")
    result = chat.call("request_return", order_id=order["order_id"], book_id=line["book_id"], reason="damaged")
    chat.say(
        f"Return {result['return_id']} is open; a label is on its way and {money(result['refund_amount'])} "
        "will be refunded."
    )
    return customer_id


def scenario_typo_id(chat: ToolConversation, request: CustomerRequest) -> str | None:
    customer_id, typo = request.customer_id, request.mistyped_order_id
    chat.call("get_order", order_id=typo)
    chat.say(f"I can't find order {typo}. Let me look at your account.")
    rows = customer_orders(chat, customer_id)
    guess = next((r for r in rows if sorted(r["order_id"]) == sorted(typo)), rows[0])
    order = chat.call("get_order", order_id=guess["order_id"])
    chat.say(f"Perhaps you meant {order['order_id']}: it is {order['status']} (total {money(order['total'])}).")
    return customer_id


def scenario_invalid_page(chat: ToolConversation, request: CustomerRequest) -> str | None:
    query = request.query
    result = chat.call("search_books", query=query, page=3)
    if "error" in result:
        result = chat.call("search_books", query=query)
    chat.call("get_book", book_id=result["results"][0]["book_id"])
    titles = ", ".join(f"'{hit['title']}'" for hit in result["results"])
    chat.say(f"There are {result['total_results']} matches ({result['total_pages']} page(s)); on this page: {titles}.")
    return None


def follow_up_orders(chat: ToolConversation, customer_id: str | None) -> None:
    chat.user("While I have you: what is going on with my other orders?")
    rows = customer_orders(chat, customer_id)
    order = chat.call("get_order", order_id=rows[-1]["order_id"])
    chat.say(
        f"You have {len(rows)} order(s); the oldest, {order['order_id']} from {order['placed_on']}, is "
        f"{order['status']}."
    )


def follow_up_recommend(chat: ToolConversation, customer_id: str | None) -> None:
    genre = chat.rng.choice(GENRES)
    chat.user(f"One more thing: can you recommend a {genre} book under $20?")
    results = chat.call("search_books", genre=genre, page_size=10)
    cheap = [hit for hit in results["results"] if hit["price"] < 20]
    if not cheap:
        chat.say(f"None of our {genre} books is under $20 at the moment, sorry.")
        return
    details = chat.call("get_book", book_id=cheap[0]["book_id"])
    stock = f"{details['stock']} in stock" if details["stock"] else "out of stock at the moment"
    chat.say(f"'{details['title']}' by {details['author']} ({details['year']}) is {money(details['price'])}; {stock}.")


def follow_up_profile(chat: ToolConversation, customer_id: str | None) -> None:
    chat.user("Can you also tell me which email and address you have on file for me?")
    customer = chat.call("get_customer", customer_id=customer_id)
    address = customer["address"]
    chat.say(f"We have {customer['email']}, and {address['street']}, {address['city']} {address['postal_code']}.")


# How the agent serves each request (pipeline/environments/bookstore_requests.py deals them).
SCENARIOS: dict[str, Callable[[ToolConversation, CustomerRequest], str | None]] = {
    "buy": scenario_buy,
    "over_stock": scenario_over_stock,
    "status": scenario_status,
    "cancel": scenario_cancel,
    "address": scenario_address,
    "browse": scenario_browse,
    "coupon": scenario_coupon,
    "return": scenario_return,
    "typo_id": scenario_typo_id,
    "invalid_page": scenario_invalid_page,
}
# Follow-up requests in the same conversation; those that need the customer only follow a scenario
# that identified one.
FOLLOW_UPS = [(follow_up_orders, True), (follow_up_recommend, False), (follow_up_profile, True)]


def tool_call_conversation(index: int, seed: str) -> dict:
    chat = ToolConversation(random.Random(seed), Bookstore())
    chat.messages.append({"role": "system", "content": BOOKSTORE_POLICY})
    request = customer_request(index, chat.rng, chat.store)
    chat.user(request.message)
    customer_id = SCENARIOS[request.scenario](chat, request)
    for follow_up, needs_customer in chat.rng.sample(FOLLOW_UPS, chat.rng.choice([0, 1, 1, 2])):
        # Each follow-up makes at most 3 calls: stay within 10 per conversation.
        if chat.calls <= 7 and (customer_id or not needs_customer):
            follow_up(chat, customer_id)
    return {"messages": chat.messages, "tools": TOOLS}


def tool_exchange(conversation: dict) -> str:
    """The calls and responses of a conversation, which is what the store's content hash sees."""
    return json.dumps(
        [
            [call["function"] for call in m["tool_calls"]] if m.get("tool_calls") else m["content"]
            for m in conversation["messages"]
            if m.get("tool_calls") or m["role"] == "tool"
        ]
    )


def tool_call_conversations(count: int) -> list[dict]:
    """The conversations; one that repeats an earlier one's calls and responses (a small catalog
    makes that likely) is redrawn from the next seed, since the store would keep one row for both."""
    conversations, seen = [], set()
    for index in range(count):
        attempt = 0
        while True:
            conversation = tool_call_conversation(index, f"tool-calls-{index}" + (f"-{attempt}" if attempt else ""))
            exchange = tool_exchange(conversation)
            if exchange not in seen:
                break
            attempt += 1
        seen.add(exchange)
        conversations.append(conversation)
    return conversations
