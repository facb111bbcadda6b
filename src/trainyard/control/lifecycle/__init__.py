"""The plane as a running thing: its assembly (`plane`), its own files (`plane_files`), the audit
at start (`store_audit`), the threads beside the loop and their supervision (`supervise`,
`retention`, `storage`, `notify`), its liveness checks and the login socket."""
