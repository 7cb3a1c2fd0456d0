"""The admin API over aiohttp: the app and its middleware, one module per resource, errors, the OpenAPI
document, SSE events, and the outbound callback client."""
