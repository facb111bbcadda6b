"""A job's directory as the plane handles it: claimed at the first launch (`claim`), made for the
account the job runs as (`ownership`), and the lines its log ends with (`end_notes`). Every file
call goes through `trainyard.jobfs` (design rule 7)."""
