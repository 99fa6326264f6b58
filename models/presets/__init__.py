"""Architecture presets: the published sizes of each family, as plain numbers."""
