"""Many problems at once: `parplan sweep` solves every combination of models, clusters, GPU
counts and jobs in parallel into a resumable JSON Lines file; `parplan report` turns the file
into tables, plots and one HTML page."""
