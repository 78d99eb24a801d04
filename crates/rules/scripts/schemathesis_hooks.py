"""Schemathesis hooks for the rules API fuzz (crates/rules/scripts/schemathesis).

An admin token may delete, demote or revoke anyone, itself included, and the fuzz finds those
requests: once it has revoked its own token, every later request answers 401 and nothing behind
the authentication is exercised any more. So the fuzz's own users (SPILLWAY_FUZZ_USERS, as
name=role pairs) keep their role when a request changes it, and a request that would delete one
of them or revoke or rotate one of its tokens (SPILLWAY_FUZZ_TOKENS, ids) is sent about a user
or token that does not exist instead: the 404 path, which the fuzz exercises anyway.
"""

import os

import schemathesis


def _items(name):
    return [item for item in os.environ.get(name, "").split(",") if item]


ROLES = dict(item.split("=", 1) for item in _items("SPILLWAY_FUZZ_USERS"))
TOKENS = set(_items("SPILLWAY_FUZZ_TOKENS"))


@schemathesis.hook
def before_call(context, case, **kwargs):
    params = case.path_parameters
    if not params:
        return
    method = case.method.upper()
    name = params.get("name")
    if name in ROLES:
        if method == "PATCH" and isinstance(case.body, dict):
            case.body["role"] = ROLES[name]
        elif method != "PATCH":
            params["name"] = "nobody-" + name
    if params.get("id") in TOKENS:
        params["id"] = "0" * 32
