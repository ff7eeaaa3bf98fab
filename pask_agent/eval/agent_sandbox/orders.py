"""Shop tools: ``search_products``, ``list_orders``, ``create_order``, ``cancel_order``.

Why: product ids and prices come only from a search, order ids only from a listing or from
the order the agent placed, so "cancel the order you created first" needs the history.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from pask_agent.eval.agent_sandbox.world import World, new_id

PAGE = 6  # orders per listing, newest first, as a shop's API pages them
STATUSES = ("all", "processing", "shipped", "delivered", "cancelled")

SPECS: tuple[dict[str, Any], ...] = (
    {
        "name": "search_products",
        "description": "Search the store's catalog by keyword.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the user is shopping for"},
            },
            "required": ["query"],
        },
    },
    {
        "name": "list_orders",
        "description": "List the user's orders, optionally only those with one status.",
        "parameters": {
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "enum": list(STATUSES),
                    "description": "Order status filter (default all)",
                },
            },
            "required": [],
        },
    },  # fmt: skip
    {
        "name": "create_order",
        "description": "Order a product from the catalog, shipped to the user's address.",
        "parameters": {
            "type": "object",
            "properties": {
                "product_id": {
                    "type": "string",
                    "description": (
                        "The product_id field (P-...) of a product search_products returned"
                    ),
                },
                "quantity": {"type": "integer", "description": "How many (default 1)"},
            },
            "required": ["product_id"],
        },
    },
    {
        "name": "cancel_order",
        "description": "Cancel an order that has not shipped yet.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {
                    "type": "string",
                    "description": "The order_id field (ORD-...) of the order",
                }
            },
            "required": ["order_id"],
        },
    },
)

_PRODUCT_KEYS = ("product_id", "name", "price_usd", "rating", "reviews", "in_stock",
                 "ships_in_days")  # fmt: skip


def search_products(world: World, query: str) -> dict[str, Any]:
    q = query.strip().casefold()
    found = [p for p in world["products"] if q in p["category"] or q in p["name"].casefold()]
    return {
        "query": query,
        "count": len(found),
        "results": [{k: p[k] for k in _PRODUCT_KEYS} for p in found],
    }


def list_orders(world: World, status: str = "all") -> dict[str, Any]:
    if status not in STATUSES:
        return {"error": f"unknown status {status!r}; use one of {list(STATUSES)}"}
    found = [o for o in world["orders"] if status == "all" or o["status"] == status]
    newest = sorted(found, key=lambda o: o["placed"], reverse=True)[:PAGE]  # stable on ties
    return {
        "status": status,
        "count": len(found),
        "showing": len(newest),
        "ship_to": world["user"]["address"],
        "orders": [{k: v for k, v in o.items() if k != "ship_to"} for o in newest],
    }


def create_order(world: World, product_id: str, quantity: int = 1) -> dict[str, Any]:
    product = next((p for p in world["products"] if p["product_id"] == product_id.strip()), None)
    if product is None:
        return {"error": f"no product with id {product_id!r}"}
    if not isinstance(quantity, int) or quantity < 1 or quantity > product["in_stock"]:
        return {"error": f"quantity must be between 1 and {product['in_stock']}"}
    product["in_stock"] -= quantity
    subtotal = round(product["price_usd"] * quantity, 2)
    shipping = 0.0 if subtotal >= 50 else 6.99
    tax = round(subtotal * 0.0625, 2)
    today = date.fromisoformat(world["today"])
    order = {
        "order_id": new_id(world, "ORD"),
        "placed": world["today"],
        "status": "processing",
        "items": [{"product_id": product["product_id"], "name": product["name"],
                   "quantity": quantity}],
        "total_usd": round(subtotal + shipping + tax, 2),
        "ship_to": world["user"]["address"],
    }  # fmt: skip
    world["orders"].append(order)
    delivery = today + timedelta(days=product["ships_in_days"] + 2)
    return {
        **order,
        "unit_price_usd": product["price_usd"],
        "subtotal_usd": subtotal,
        "shipping_usd": shipping,
        "tax_usd": tax,
        "estimated_delivery": delivery.isoformat(),
        "payment": "Visa ending 4417",
    }


def cancel_order(world: World, order_id: str) -> dict[str, Any]:
    order = next((o for o in world["orders"] if o["order_id"] == order_id.strip()), None)
    if order is None:
        return {"error": f"no order with id {order_id!r}"}
    if order["status"] != "processing":
        return {"error": f"order {order_id} is {order['status']} and cannot be cancelled"}
    order["status"] = "cancelled"
    for item in order["items"]:
        product = next(p for p in world["products"] if p["product_id"] == item["product_id"])
        product["in_stock"] += item["quantity"]
    return {
        "order_id": order["order_id"],
        "status": "cancelled",
        "placed": order["placed"],
        "items": order["items"],
        "cancelled_on": world["today"],
        "refund_usd": order["total_usd"],
        "refund_to": "Visa ending 4417",
        "refund_eta": "3-5 business days",
    }


FUNCTIONS = {"search_products": search_products, "list_orders": list_orders,
             "create_order": create_order, "cancel_order": cancel_order}  # fmt: skip
