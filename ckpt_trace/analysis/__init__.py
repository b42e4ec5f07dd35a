"""Analytics over traces: summaries and comparisons, as JSON-able dicts."""
