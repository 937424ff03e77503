import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.judge.analysis import token_table_html  # noqa: E402
from ftbench.judge.figures import save_svg, token_histogram  # noqa: E402
from ftbench.data.tokens import load_stats, token_rows  # noqa: E402

stats = load_stats(snakemake.input)
with open(snakemake.output.html, "w") as f:
    f.write(token_table_html(stats))
save_svg(token_histogram(token_rows(stats)), snakemake.output.figure)
