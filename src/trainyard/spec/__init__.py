"""The user-facing configuration and job options: the models (`models`), their bounds and limits,
and the option parsers that the CLI needs without pydantic (`parsing`, `io_patterns`,
`mail_types`, `signals`). Empty on purpose: importing `trainyard.spec.parsing` loads nothing else."""
