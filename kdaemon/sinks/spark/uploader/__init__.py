"""The Spark uploader: the one process per daemon that owns the SparkSession (or writes directly
with pyarrow) and turns the workers' staged batches into table commits.

``process.py`` is the process (its socket, jobs, replies; ``run`` is the companion's entry);
``writer.py`` the session and the writes through Spark; ``session_start.py`` starts that
session beside the loop; ``fresh.py`` what of a job is new; ``failures.py`` which failures are
the job's and which the rows'; ``refused_rows.py`` the rows a table refuses; ``ahead.py`` the
rows of early-staged batches, built while their worker reads on.
"""
