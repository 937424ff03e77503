rule prepare_dataset:
    output:
        train="results/data/{dataset}/train.parquet",
        eval="results/data/{dataset}/eval.parquet",
        summary="results/data/{dataset}/summary.json",
    log:
        "logs/prepare_dataset/{dataset}.log",
    benchmark:
        "benchmarks/prepare_dataset/{dataset}.tsv"
    conda:
        "../envs/train.yaml"
    params:
        dataset=dataset_def,
        seed=config["seed"],
    script:
        "../workflow/scripts/prepare_dataset.py"


rule token_stats:
    input:
        model=wildcard_model_manifest,
        data="results/data/{dataset}/train.parquet",
    output:
        "results/token_stats/{dataset}/{model}.json",
    log:
        "logs/token_stats/{dataset}/{model}.log",
    benchmark:
        "benchmarks/token_stats/{dataset}/{model}.tsv"
    conda:
        "../envs/train.yaml"
    params:
        dataset=dataset_def,
        max_length=config["training"]["max_seq_length"],
    script:
        "../workflow/scripts/token_stats.py"
