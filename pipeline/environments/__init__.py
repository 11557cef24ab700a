"""The real environments the demo corpus was made by (bash in a scratch home, the bookstore tool service, the
household text game), their deals, and gymnasium environments over them to measure a simulator against (issue 31)."""
