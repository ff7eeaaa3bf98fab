"""Ray Serve replicas of the OpenAI server (``pask-agent serve --ray``), each with its own runtime.

Here: the routing key of a request and the router that keeps a conversation on the replica
holding its KV, the in-process host that runs the server app inside a replica, and the Ray
Serve deployments. May import server/ and below; only ``deployment`` imports Ray.
"""
