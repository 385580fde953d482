"""Reaching the Hugging Face hub from the corpus tools, quickly and quietly.

`huggingface_hub` retries a request that cannot connect five times over ~23 s, logging a
warning each time; with no network every corpus command would take that long to say so. One
unretried request up front answers the question in a second (or a timeout), so an offline run
fails at once, with one message, before it creates anything.
"""


def quiet_hub_logging() -> None:
    """Print each hub warning once: the hub's logger has a handler of its own, so with a
    root handler too (`logging.basicConfig`) every warning would also be printed again."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.disable_propagation()


def hub_unreachable(endpoint: str | None = None) -> str | None:
    """Why the hub at `endpoint` (default: HF_ENDPOINT or huggingface.co) cannot be reached;
    None when it answers at all (any HTTP status) or when HF_HUB_OFFLINE is set (then the hub
    client reads its local files only and fails fast by itself)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return None
    url = endpoint or constants.ENDPOINT
    try:
        get_session().head(url, timeout=constants.HF_HUB_ETAG_TIMEOUT, follow_redirects=False)
    except Exception as e:  # the client's transport errors: DNS, refused, timeout, TLS, proxy
        return f"cannot reach the Hugging Face hub at {url} ({type(e).__name__}: {e})"
    return None
