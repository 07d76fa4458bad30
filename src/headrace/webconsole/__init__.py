"""``headrace console``: a web console for a Kafka-protocol cluster (issue 13).

``model`` (pure: validation, series), ``source`` (blocking Kafka-protocol reads and
writes), ``server`` (aiohttp: the JSON API, the sampler, the static page) and ``command``
(the click command). The page is ``static/`` (vanilla HTML, CSS and JavaScript; Plotly.js
comes from the ``plotly`` package at run time).
"""
