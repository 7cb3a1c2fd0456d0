"""``GET /api/openapi.json`` (docs/API.md): the OpenAPI 3.1 description of every ``/api`` route.

Bodies are described by the msgspec Structs that decode the requests and encode the answers
(``msgspec.json.schema_components``), so the document cannot drift from what the handlers accept and
send; what no Struct carries (the routes, their parameters, which status each answers) is the table
``OPERATIONS`` (``operations/``, one module per resource), checked against the registered routes by
``tests/unit/test_openapi.py`` and exercised against a live gateway by schemathesis
(``tests/integration/test_openapi.py``).

Query parameters are described as the handlers read them: an empty value (``?state=``) is the same as
leaving the parameter out, so a string filter with an enum also accepts ``""``.

The package: ``params.py`` (the table's vocabulary: parameters, ``Op``), ``operations/`` (the table, by
resource), ``components.py`` (the Structs described and their schemas), ``document.py`` (the builder).
"""

from scheduler_gateway.daemon.http.openapi.components import EVENT_TYPES, REF, DisconnectEvent, GapEvent
from scheduler_gateway.daemon.http.openapi.document import OPENAPI_PATH, build_document, document_bytes
from scheduler_gateway.daemon.http.openapi.operations import OPERATIONS
from scheduler_gateway.daemon.http.openapi.params import Op

__all__ = [
    "EVENT_TYPES",
    "OPENAPI_PATH",
    "OPERATIONS",
    "REF",
    "DisconnectEvent",
    "GapEvent",
    "Op",
    "build_document",
    "document_bytes",
]
