"""Schemathesis hooks for the rules API fuzz (crates/rules/scripts/schemathesis).

An admin token may delete, demote or revoke anyone, itself included, and the fuzz finds those
requests: once it has revoked its own token, every later request answers 401 and nothing behind
the authentication is exercised any more. So the fuzz's own users (SPILLWAY_FUZZ_USERS, as
name=role pairs) keep their role when a request changes it, and a request that would delete one
of them or revoke or rotate one of its tokens (SPILLWAY_FUZZ_TOKENS, ids) is sent about a user
or token that does not exist instead: the 404 path, which the fuzz exercises anyway.

PUT /v1/rules/{id} is sent to a rule the script made (SPILLWAY_FUZZ_RULE, through the
configuration), since a random id names no rule. That rule stays an incident override (a
`ttl` and a `reason` are added to each body), which an apply does not remove, and it is not
deleted: a DELETE naming it is sent about a rule that does not exist. DELETE /v1/rules/{id} is
sent to a rule made for it just before (SPILLWAY_FUZZ_DOOMED_RULE names the placeholder id), so
each deletion the fuzz sends can reach a rule.
"""

import itertools
import json
import os
import urllib.request

import schemathesis


def _items(name):
    return [item for item in os.environ.get(name, "").split(",") if item]


ROLES = dict(item.split("=", 1) for item in _items("SPILLWAY_FUZZ_USERS"))
TOKENS = set(_items("SPILLWAY_FUZZ_TOKENS"))
RULE = os.environ.get("SPILLWAY_FUZZ_RULE")
NO_RULE = "00000000-0000-0000-0000-000000000000"
DOOMED = os.environ.get("SPILLWAY_FUZZ_DOOMED_RULE")
COUNTER = itertools.count()


def _doomed_rule():
    """A fresh incident override for a DELETE to delete: its id."""
    n = f"{os.getpid()}-{next(COUNTER)}"
    body = {"service": "fuzz", "name": f"doomed-{n}", "match": {"caller": f"doomed-{n}"},
            "limit": "10/s", "ttl": "1d", "reason": "the rules API fuzz"}
    request = urllib.request.Request(
        os.environ["SPILLWAY_FUZZ_BASE"] + "/v1/rules", data=json.dumps(body).encode(),
        method="POST", headers={"authorization": "Bearer " + os.environ["SPILLWAY_FUZZ_ADMIN"]})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["id"]


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
    if DOOMED and params.get("id") == DOOMED and method == "DELETE":
        params["id"] = _doomed_rule()
    if RULE and params.get("id") == RULE:
        if method == "DELETE":
            params["id"] = NO_RULE
        elif method == "PUT" and isinstance(case.body, dict):
            case.body["ttl"] = "1d"
            case.body["reason"] = "the rules API fuzz"
