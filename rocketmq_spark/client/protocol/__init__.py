"""The remoting protocol as pure functions over bytes: frames, headers, messages, routes."""
