"""What the API and the console share: answers that carry a message's bytes,
path and query parameters, the inbox's live feed and its event stream. Neither
front door imports the other; `app.server` mounts them side by side."""
