rule materialize_model:
    output:
        "results/models/{model}/{scale}/model.json",
    params:
        model=model_def,
        architecture=architecture_file,
        seed=config["seed"],
    log:
        "logs/materialize_model/{model}/{scale}.log",
    benchmark:
        "benchmarks/materialize_model/{model}/{scale}.tsv"
    resources:
        gpu=1,
    conda:
        "../envs/train.yaml"
    script:
        "../workflow/scripts/materialize_model.py"
