rule profile:
    input:
        unpack(run_inputs),
    output:
        trace="results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/trace.json.gz",
        summary="results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/summary.json",
    log:
        "logs/profile/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.log",
    benchmark:
        "benchmarks/profile/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.tsv"
    conda:
        run_env
    resources:
        gpu=run_gpus,  # a variant over several GPUs is profiled over all of them (rank 0's trace)
        mem_mb=16000,
        runtime=run_runtime_min,
    params:
        run=run_params,
        base_dir=str(BASE_DIR),
    script:
        "../workflow/scripts/profile.py"


rule profile_page:
    """The profile's page for the report, rendered where the report is built (the run needs no table library)."""
    input:
        summary="results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/summary.json",
    output:
        report(
            "results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/summary.html",
            caption="../report/profile.rst",
            category="{study}",
            subcategory="Profiles",
            labels={
                "model": "{model}",
                "dataset": "{dataset}",
                "variant": "{variant}",
                "batch size": "{batch_size}",
                "figure": "profile",
            },
        ),
    log:
        "logs/profile_page/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.log",
    benchmark:
        "benchmarks/profile_page/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.tsv"
    conda:
        "../envs/report.yaml"
    script:
        "../workflow/scripts/profile_page.py"


rule merged_profile_page:
    """A profile summary measured elsewhere (config merge_runs: a folder's profiles/), as a page of the report;
    its model and variant need not be in this config."""
    input:
        summary=merged_profile_summary,
    output:
        report(
            "results/merged_profiles/{source}/{study}/{key}/summary.html",
            caption="../report/profile.rst",
            category="{study}",
            subcategory="Profiles measured elsewhere",
            labels={
                "measured in": "{source}",
                "run (model/scale/dataset/variant/batch)": "{key}",
            },
        ),
    log:
        "logs/merged_profile_page/{source}/{study}/{key}.log",
    benchmark:
        "benchmarks/merged_profile_page/{source}/{study}/{key}.tsv"
    wildcard_constraints:
        source="[^/]+",
        key=".+",
    conda:
        "../envs/report.yaml"
    script:
        "../workflow/scripts/profile_page.py"
