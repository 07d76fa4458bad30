"""Security (issue 12): principals, SASL credentials, TLS listeners, ACLs and quotas."""
