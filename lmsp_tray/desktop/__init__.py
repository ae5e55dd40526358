"""The desktop: the tray icon and menu, notifications, the clipboard, start at login.

The only code that imports pystray and PIL. `tray.TrayApp` draws the menu that `menu` describes,
`backend` connects it to a running daemon, `toolkit` loads pystray's backend, `icons` draws the
icon states, `system` holds platform helpers and `autostart` writes login items.
"""
