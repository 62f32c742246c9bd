"""Chat templates: rendered with jinja2 in transformers' exact environment, every character attributed to
the request field that produced it."""
