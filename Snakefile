from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "config/schema/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/models.smk"
include: "rules/train.smk"
include: "rules/profile.smk"
include: "rules/report.smk"


rule all:
    input:
        all_targets(),
    default_target: True
