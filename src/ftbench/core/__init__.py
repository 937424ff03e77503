"""The leaf modules every layer may import: the knobs a variant sets, the record's format, the standard library's text."""
