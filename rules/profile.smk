rule profile:
    input:
        unpack(run_inputs),
    output:
        trace="results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/trace.json.gz",
        summary="results/profiles/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/summary.json",
        report=report(
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
    params:
        run_hash=run_hash,
        base_dir=str(BASE_DIR),
    log:
        "logs/profile/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.log",
    benchmark:
        "benchmarks/profile/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.tsv"
    resources:
        gpu=1,
        mem_mb=16000,
        runtime=60,
    conda:
        "../envs/train.yaml"
    script:
        "../workflow/scripts/profile.py"
