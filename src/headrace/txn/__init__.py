"""Transactions (issue 10): the transaction coordinator over ``__transaction_state``."""
