import sys

from snakemake.utils import min_version

sys.path.insert(0, f"{workflow.basedir}/src")
from ftbench.config.settings import validate_config  # noqa: E402

min_version("9.0")


configfile: "config/config.yaml"


# one short line naming the key, before anything else runs (the library's checks follow in rules/common.smk)
validate_config(config, f"{workflow.basedir}/config/schema/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/models.smk"
include: "rules/train.smk"
include: "rules/profile.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),
