"""The OpenAPI document as scripts/clients.sh gives it to openapi-python-client: where an operation
offers JSON Lines (`application/x-ndjson`) beside JSON (`application/json`), as the transcript
import and export do, the JSON form alone.

openapi-python-client 0.29 dispatches a body offered in two media types on
`isinstance(body, list[Entry])`, which Python refuses at run time (a parameterized generic is no
class), and parses a response offered in two by the first; with one form each operation is typed
and works. JSON Lines stay the server's default on the wire: the scenario asks for JSON with
`Accept: application/json`.

Usage: python json_form.py DOCUMENT OUTPUT
"""

import json
import sys


def json_form_alone(node):
    if isinstance(node, dict):
        content = node.get("content")
        if isinstance(content, dict) and "application/json" in content:
            content.pop("application/x-ndjson", None)
        for value in node.values():
            json_form_alone(value)
    elif isinstance(node, list):
        for value in node:
            json_form_alone(value)


def main():
    source, target = sys.argv[1], sys.argv[2]
    with open(source) as file:
        document = json.load(file)
    json_form_alone(document["paths"])
    with open(target, "w") as file:
        json.dump(document, file, indent=2)


if __name__ == "__main__":
    main()
