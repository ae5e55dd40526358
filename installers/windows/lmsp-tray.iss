; Inno Setup script: a per-user installer for lmsp-tray on Windows (no administrator rights).
; Build dist\lmsp-tray.exe first with installers\windows\lmsp-tray.spec (PyInstaller), then:
;     iscc installers\windows\lmsp-tray.iss          (Inno Setup 6)
; The installer lands in dist\lmsp-tray-setup-<version>.exe. It installs into
; %LOCALAPPDATA%\Programs\lmsp-tray, adds a Start menu entry and offers to start
; the tray. It does NOT turn on start at login: the tray's "Start at login"
; checkbox (or `lmsp-tray autostart enable`) writes HKCU\...\Run\lmsp-tray.
; Uninstalling stops the tray and removes that Run value; models, settings and
; tokens (in %LOCALAPPDATA%\lmsp-tray and the Credential Manager) are kept.

#define AppName "lmsp-tray"
#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif

[Setup]
AppId={{6B0C9E52-6C1F-4C53-9F59-3A2B8F0E7D41}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=lmsp-tray
DefaultDirName={localappdata}\Programs\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
DisableDirPage=auto
PrivilegesRequired=lowest
OutputDir=..\..\dist
OutputBaseFilename=lmsp-tray-setup-{#AppVersion}
SetupIconFile=..\..\assets\lmsp-tray.ico
UninstallDisplayIcon={app}\lmsp-tray.exe
UninstallDisplayName={#AppName}
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
Compression=lzma2
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes
RestartApplications=no

[Files]
Source: "..\..\dist\lmsp-tray.exe"; DestDir: "{app}"; Flags: ignoreversion
Source: "..\..\assets\lmsp-tray.ico"; DestDir: "{app}"; Flags: ignoreversion

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\lmsp-tray.exe"; IconFilename: "{app}\lmsp-tray.ico"

[Run]
Filename: "{app}\lmsp-tray.exe"; Description: "Start {#AppName} now"; Flags: nowait postinstall skipifsilent

[UninstallRun]
Filename: "{sys}\taskkill.exe"; Parameters: "/F /IM lmsp-tray.exe"; Flags: runhidden; RunOnceId: "StopTray"

[Registry]
; Nothing is written at install time (ValueType: none); only the start-at-login
; values the app may have written are removed on uninstall.
Root: HKCU; Subkey: "Software\Microsoft\Windows\CurrentVersion\Run"; ValueType: none; ValueName: "lmsp-tray"; Flags: uninsdeletevalue dontcreatekey
Root: HKCU; Subkey: "Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"; ValueType: none; ValueName: "lmsp-tray"; Flags: uninsdeletevalue dontcreatekey
