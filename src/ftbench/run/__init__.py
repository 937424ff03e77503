"""Running a job: the executor and its supervisor, the fork server, profiling, generation and each model family's runner."""
