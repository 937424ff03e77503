"""Judging and reporting: the runs tables, the verdicts on published cells and on quality, the comparisons and the report's pages and figures."""
