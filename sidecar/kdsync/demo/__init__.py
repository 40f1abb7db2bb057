"""The local end-to-end demonstration (hack/demo)."""
