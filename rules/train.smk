rule train:
    input:
        unpack(run_inputs),
    output:
        metrics="results/runs/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/metrics.json",
        steps="results/runs/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/steps.csv",
        memory="results/runs/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/memory.csv",
        adapter=directory(
            "results/runs/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/adapter"
        ),
    log:
        "logs/train/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.log",
    benchmark:
        "benchmarks/train/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.tsv"
    conda:
        run_env
    resources:
        gpu=run_gpus,
        mem_mb=16000,
        runtime=run_runtime_min,
    params:
        run=run_params,
        base_dir=str(BASE_DIR),
    script:
        "../workflow/scripts/train.py"


rule generate:
    input:
        unpack(generate_inputs),
    output:
        json="results/generate/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/answers.json",
        html=report(
            "results/generate/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}/answers.html",
            caption="../report/generate.rst",
            category="{study}",
            subcategory="Generations",
            labels={
                "model": "{model}",
                "dataset": "{dataset}",
                "variant": "{variant}",
                "batch size": "{batch_size}",
                "figure": "answers before/after",
            },
        ),
    log:
        "logs/generate/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.log",
    benchmark:
        "benchmarks/generate/{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}.tsv"
    conda:
        "../envs/train.yaml"
    resources:
        gpu=lambda wildcards: gpus_asked(1, wildcards.scale),
        mem_mb=16000,
    params:
        generation=generation_settings,
        seed=config["seed"],
        kind=dataset_kind,
    script:
        "../workflow/scripts/generate.py"
