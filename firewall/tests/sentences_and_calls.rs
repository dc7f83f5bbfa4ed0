//! Credentials a model writes into a markdown list (`**Password:** X`) or a sentence ("the
//! password for the staging database is X", "Das Passwort lautet X"), passes to a client's
//! constructor (`Client(sid, token)`, `new mysqli(host, user, pw)`, `client.run(token)`) or
//! puts on a command line (`7z a -pX`, `net user NAME X`), writes as an environment lookup's
//! fallback (`os.environ.get("SECRET_KEY", "X")`) or into the call that signs with it
//! (`jwt.sign(payload, "X")`), a connect string (`sqlplus USER/X@DB`), a router's or VPN's
//! configuration (`username U secret 0 X`, `: PSK "X"`, `wpa-psk X`, a chap-secrets line), a
//! secret store's command line (`az keyvault secret set --value X`, `echo X | wrangler secret
//! put`, `pulumi config set --secret`), a setter (`ds.setPassword("X")`) or a bare key name
//! (`key = b'…'`) block one-shot and streamed, and no byte of the value goes out;
//! the same sentences and calls that give no credential stay quiet, and so do code where a
//! value would be (`apiKey: azureADTokenProvider ?? apiKey`) and the OAuth RFCs' examples.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{Action, Detectors, ScanContext};

/// Each text, and the value in it that must block.
const LEAKS: &[(&str, &str)] = &[
    ("Sure. The password for the staging database is hX7#kq2Lm9vR, rotate it after the demo.", "hX7#kq2Lm9vR"),
    ("Here are the staging credentials:\n\n- **Username:** admin\n- **Password:** hX7kq2Lm9vRw\n", "hX7kq2Lm9vRw"),
    ("1. Open the console.\n2. **API key**: `8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG`\n", "8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG"),
    ("Your new password is: Kq8#vTz2Lm\nChange it at first login.", "Kq8#vTz2Lm"),
    ("The token for the CI runner is 8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG.", "8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG"),
    ("Das Passwort für den Server lautet Vq8mLz2Tx9, bitte nicht weitergeben.", "Vq8mLz2Tx9"),
    ("La contraseña del servidor es hX7#kq2Lm9vR y el usuario es admin.", "hX7#kq2Lm9vR"),
    ("Der API-Schlüssel lautet 8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG.", "8f3kQ2pL9mZ7vX4cN1bT6yH0wR5jS3dG"),
    (
        "```python\nfrom twilio.rest import Client\nclient = Client(\"AC3f9b2e71c4d8a05e6b1f27c9d4e8a013\", \"9c41e7b2d05f8a36c1e4b7d29a0f3c58\")\n```",
        "9c41e7b2d05f8a36c1e4b7d29a0f3c58",
    ),
    (
        "configuration = Configuration()\nconfiguration.api_key[\"apiKeyAuth\"] = \"5f1c9a7e3b2d48c6a0e9f1b7d3c5a28e\"\n",
        "5f1c9a7e3b2d48c6a0e9f1b7d3c5a28e",
    ),
    (
        "bot = commands.Bot(command_prefix=\"!\")\nbot.run('MTE3NzQ1NjM1ODk0NTI5ODQzNg.GxYz12.Qw9pL3mN7vB2kR5tY8uI1oP4aS6dF0gH3jK9lZ')\n",
        "MTE3NzQ1NjM1ODk0NTI5ODQzNg.GxYz12.Qw9pL3mN7vB2kR5tY8uI1oP4aS6dF0gH3jK9lZ",
    ),
    ("<?php\n$conn = new mysqli(\"localhost\", \"root\", \"hX7kq2Lm9vR\", \"shop\");\n", "hX7kq2Lm9vR"),
    ("db, err := sql.Open(\"mysql\", \"app:Tq4#vL9xWm2s@tcp(127.0.0.1:3306)/prod\")", "Tq4#vL9xWm2s"),
    (
        "AmazonS3 s3 = new AmazonS3Client(new BasicAWSCredentials(accessKey, \"q8Hk2RvT0nLp3XwZ9sYbE4mJc7UaF1dGiK6oVt5B\"));",
        "q8Hk2RvT0nLp3XwZ9sYbE4mJc7UaF1dGiK6oVt5B",
    ),
    ("$ aws configure\nAWS Access Key ID [None]: \nAWS Secret Access Key [None]: mEhjO8I2ky1dhu3alnuf/8WS/kZjL8FKP6DyR39N\n", "mEhjO8I2ky1dhu3alnuf/8WS/kZjL8FKP6DyR39N"),
    (
        "const transporter = nodemailer.createTransport({\n  service: 'gmail',\n  auth: { user: 'alerts@corp.io', pass: 'vbgt xkmw ryqe hzfo' },\n});",
        "vbgt xkmw ryqe hzfo",
    ),
    ("Encrypt the dump first:\n\n    7z a -pQw7Zt2Kx9Lm4 -mhe=on dump.7z dump.sql\n", "Qw7Zt2Kx9Lm4"),
    ("On the domain controller run `net user svc_sql Mv4Kq9Tz2Wx7 /add /domain`.", "Mv4Kq9Tz2Wx7"),
    ("```java\nSystem.setProperty(\"db.password\", \"hX7kq2Lm9vRw\");\n```", "hX7kq2Lm9vRw"),
    ("For the staging box:\n**Login:** `svc_backup` / `Mv4Kq9Tz2Wx7`\n", "Mv4Kq9Tz2Wx7"),
    (
        "SECRET_KEY = os.environ.get(\"SECRET_KEY\", \"q8k2mXq7wz0v3pR1ty5ue9oi4l6nb7Hs\")\nDEBUG = True\n",
        "q8k2mXq7wz0v3pR1ty5ue9oi4l6nb7Hs",
    ),
    ("const secret = process.env.JWT_SECRET || 'kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0';", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0"),
    ("const token = jwt.sign({ id: user.id }, 'kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0', { expiresIn: '1h' });", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0"),
    ("sig = hmac.new(b\"Tz8vQ2mLxR4kW7pN\", body, hashlib.sha256).hexdigest()", "Tz8vQ2mLxR4kW7pN"),
    ("Then log in to the registry:\n\n    echo \"Hk29qLmx7Vb\" | docker login ghcr.io -u deploy --password-stdin\n", "Hk29qLmx7Vb"),
    ("User.objects.create_superuser('admin', 'admin@corp.io', 'Hk29qLmx7Vb')", "Hk29qLmx7Vb"),
    ("APP_KEY=base64:kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo=\nAPP_DEBUG=false\n", "base64:kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo="),
    ("network={\n    ssid=\"HomeNet\"\n    psk=\"Hk29qLmx7Vb\"\n}\n", "Hk29qLmx7Vb"),
    ("The API key you need is kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0, keep it out of git.", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0"),
    ("Export the schema:\n\n    expdp system/Hk29qLmx7Vb@ORCL schemas=hr directory=dp\n", "Hk29qLmx7Vb"),
    ("interface Gi0/1\n!\nusername netops privilege 15 secret 0 Hk29qLmx7Vb\nsnmp-server community Rq7vZt2Lm9 RO\n", "Hk29qLmx7Vb"),
    ("conn %default\n\n# /etc/ipsec.secrets\n: PSK \"kQ9vLm2Xw8RtZp4N\"\n", "kQ9vLm2Xw8RtZp4N"),
    ("az keyvault secret set --vault-name kv-prod --name StripeKey --value Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("dotnet user-secrets set \"Smtp:Password\" \"Hk29qLmx7Vb\"", "Hk29qLmx7Vb"),
    ("aws ssm put-parameter --name /prod/db/password --value 'Hk29qLmx7Vb' --type SecureString", "Hk29qLmx7Vb"),
    ("echo -n 'kQ9vLm2Xw8RtZp4NcYb6HdJs' | npx wrangler secret put STRIPE_KEY", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("lftp -u deploy,Hk29qLmx7Vb sftp://files.corp.io", "Hk29qLmx7Vb"),
    (
        "var key = new SymmetricSecurityKey(Encoding.UTF8.GetBytes(\"kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0\"));",
        "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0",
    ),
    ("var jwtKey = []byte(\"kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0\")", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0"),
    ("\"Jwt\": {\n    \"Issuer\": \"api.corp.io\",\n    \"Key\": \"kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0\"\n}", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0"),
    ("credentials = pika.PlainCredentials('app', 'Hk29qLmx7Vb')", "Hk29qLmx7Vb"),
    ("Данные от сервера:\n\nκωδικός: Hk29qLmx7Vb\nmật khẩu: Hk29qLmx7Vb", "Hk29qLmx7Vb"),
    ("数据库的密码是Hk29qLmx7Vb，请妥善保管。", "Hk29qLmx7Vb"),
    ("Zugangsdaten: admin / Hk29qLmx7Vb", "Hk29qLmx7Vb"),
    ("key \"certbot.\" {\n  algorithm hmac-sha512;\n  secret \"kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo=\";\n};", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo="),
    ("port 26379\nsentinel monitor mymaster 10.0.0.4 6379 2\nsentinel auth-pass mymaster Hk29qLmx7Vb\n", "Hk29qLmx7Vb"),
    ("export CONSUL_HTTP_TOKEN=c4e81f27-9b3d-4a56-8e0c-72d9f1a5b364", "c4e81f27-9b3d-4a56-8e0c-72d9f1a5b364"),
    ("Here is your token → kQ9vLm2Xw8RtZp4NcYb6HdJs", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("xfreerdp /v:10.0.0.5 /u:admin /p:Hk29qLmx7Vb /cert:ignore", "Hk29qLmx7Vb"),
    ("services:\n  cache:\n    command: [\"redis-server\", \"--requirepass\", \"Hk29qLmx7Vb\"]\n", "Hk29qLmx7Vb"),
    ("ansible-playbook site.yml --extra-vars \"ansible_become_pass=Hk29qLmx7Vb\"", "Hk29qLmx7Vb"),
    ("db_password <- \"Hk29qLmx7Vb\"\ncon <- dbConnect(RPostgres::Postgres(), password = db_password)", "Hk29qLmx7Vb"),
    ("I've generated a key for you: kQ9vLm2Xw8RtZp4NcYb6HdJs", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("Done. The admin password has been reset to Hk29qLmx7Vb, change it at first login.", "Hk29qLmx7Vb"),
    ("pulumi config set --secret dbPassword Hk29qLmx7Vb", "Hk29qLmx7Vb"),
    ("ansible-vault encrypt_string 'Hk29qLmx7Vb' --name 'db_password'", "Hk29qLmx7Vb"),
    ("rclone config create nas sftp host nas.corp.io user deploy pass Hk29qLmx7Vb", "Hk29qLmx7Vb"),
    ("auto wlan0\niface wlan0 inet dhcp\n    wpa-ssid HomeNet\n    wpa-psk Hk29qLmx7Vb\n", "Hk29qLmx7Vb"),
    ("iwconfig wlan0 essid HomeNet key s:Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("# /etc/ppp/chap-secrets\n# client server secret IP addresses\n\"vpnuser\" * \"Hk29qLmx7Vb\" *\n", "Hk29qLmx7Vb"),
    ("vncpasswd -f <<< Hk29qLmx7Vb > ~/.vnc/passwd", "Hk29qLmx7Vb"),
    ("aws ssm put-parameter --name /prod/db/password --type SecureString --value Hk29qLmx7Vb", "Hk29qLmx7Vb"),
    ("HikariDataSource ds = new HikariDataSource();\nds.setUsername(\"app\");\nds.setPassword(\"Hk29qLmx7Vb\");", "Hk29qLmx7Vb"),
    ("from ftplib import FTP\nftp = FTP('files.corp.io', 'deploy', 'Hk29qLmx7Vb')", "Hk29qLmx7Vb"),
    ("System.setProperty(\"javax.net.ssl.keyStorePassword\", \"Hk29qLmx7Vb\");", "Hk29qLmx7Vb"),
    ("from cryptography.fernet import Fernet\n\nkey = b'kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo='\nf = Fernet(key)", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo="),
    ("Use the token kQ9vLm2Xw8RtZp4NcYb6HdJs to authenticate against the staging API.", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("Set `OPENAI_API_KEY` to `kQ9vLm2Xw8RtZp4NcYb6HdJs` in your shell.", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("The box is up. Try logging in as root with Hk29qLmx7Vb4T and change it.", "Hk29qLmx7Vb4T"),
    ("Staging services:\n\n- Postgres: `app` / `Hk29qLmx7Vb4T`\n- Redis: no auth\n", "Hk29qLmx7Vb4T"),
    ("Use passphrase Hk29qLmx7Vb4T to unlock the deploy key.", "Hk29qLmx7Vb4T"),
    ("Set the `OPENAI_API_KEY` environment variable to `kQ9vLm2Xw8RtZp4NcYb6HdJs` and restart.", "kQ9vLm2Xw8RtZp4NcYb6HdJs"),
    ("Username and password: admin / Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("Логин и пароль: admin / Hk29qLmx7Vb4T\nПароль сброшен на Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("Доступ к базе: postgres / Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("Identifiant et mot de passe : admin / Hk29qLmx7Vb4T", "Hk29qLmx7Vb4T"),
    ("<appSettings>\n  <add key=\"StorageKey\" value=\"kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo=\" />\n</appSettings>", "kQ9vLm2Xw8RtZp4NcYb6HdJs1GaEuQf0mXyZkT3BaQo="),    ("Your bot token is MTAyNTUzNTA4Mjg5OTYxMDM4Mw.S_xNH0.Kiw_zVhlocrSOtYOkesoidKTetQBuScSg3_Qat, keep it private.", "MTAyNTUzNTA4Mjg5OTYxMDM4Mw.S_xNH0.Kiw_zVhlocrSOtYOkesoidKTetQBuScSg3_Qat"),
    ("Токен бота:\nNzkyNzE1NDU0MTk2MDg4ODQy.X-hvzA.Ovy4MCQywSkoMRRclStW4xAYK7I\n", "NzkyNzE1NDU0MTk2MDg4ODQy.X-hvzA.Ovy4MCQywSkoMRRclStW4xAYK7I"),
    ("Datadog application key: a7daeef7d5c5661f80e7f8964c20f6233dd26106", "a7daeef7d5c5661f80e7f8964c20f6233dd26106"),
    ("The VM is ready. Login with admin and FLCUwwgh430& to finish the setup.", "FLCUwwgh430&"),
    ("I've updated the config with your key (JD0OAjZIyAKGfCUO7dWBKdhL2MU0TznT04Q3uBKX).", "JD0OAjZIyAKGfCUO7dWBKdhL2MU0TznT04Q3uBKX"),
    ("KeyStore ks = KeyStore.getInstance(\"PKCS12\");\nks.load(in, \"WYWHotjd726*\".toCharArray());", "WYWHotjd726*"),
    ("PBEKeySpec spec = new PBEKeySpec(\"Wq7Kz2Tv9Lx4\".toCharArray(), salt, 65536, 256);", "Wq7Kz2Tv9Lx4"),
    ("Net::SMTP.start('smtp.corp.io', 587, 'corp.io', 'mailer', 'RHVFzjcd502&', :login) do |smtp|", "RHVFzjcd502&"),
    ("android {\n    signingConfigs {\n        release {\n            storePassword \"UKRwrhi262%td\"\n", "UKRwrhi262%td"),
    ("$ds = ldap_connect(\"ldap.corp.io\");\nldap_bind($ds, \"cn=admin,dc=corp,dc=io\", \"NCMfger939%ix\");", "NCMfger939%ix"),
    ("echo -e 'MBGiioo644@oi\\nMBGiioo644@oi' | passwd deploy", "MBGiioo644@oi"),
    ("Свой пароль для входа в панель я поменял на OPXpcds052*wn", "OPXpcds052*wn"),
    ("import boto3\n\nMY_S3_SK = \"EIMm+nzGVFax+raexyb+xCY+On8iRR8PlRsj6qW/\"\n", "EIMm+nzGVFax+raexyb+xCY+On8iRR8PlRsj6qW/"),
    ("spawn ssh deploy@10.0.0.4\nexpect \"*assword*\"\nsend \"Hk29qLmx7Vb4T\\r\"\ninteract", "Hk29qLmx7Vb4T"),
    ("CLOUDINARY_URL=cloudinary://309058300574703:g5Uvfv5LH_Nuct4vGcbyMOA6mvp@demo", "g5Uvfv5LH_Nuct4vGcbyMOA6mvp"),
];

#[test]
fn a_credential_in_a_sentence_or_a_call_blocks_one_shot_and_streamed() {
    let rules = builtin();
    let (ctx, det) = (ScanContext::anonymous(), Arc::new(Detectors::default()));
    for &(text, secret) in LEAKS {
        let found = rules.scan(text);
        let at = text.find(secret).unwrap_or(usize::MAX);
        assert!(
            found.iter().any(|f| f.start == at && f.end == at + secret.len() && f.action == Action::Block),
            "{text:?}: {found:?}"
        );
        check_blocks_in_every_chunking(&rules, &ctx, &det, text, &[3, 7, 16], &secret[..4]);
    }
}

#[test]
fn sentences_and_calls_without_a_credential_stay_quiet() {
    let rules = builtin();
    for text in [
        "The password for this account is the one you set during installation.",
        "The password for the admin user is stored in the vault.",
        "The token for the next page is returned in the response.",
        "Das Passwort ist falsch. La contraseña es incorrecta. Der API-Schlüssel ist ungültig.",
        "client = Client(account_sid, auth_token)\nbot.run(TOKEN)\n",
        "$conn = new mysqli($servername, $username, $password, $dbname);",
        "dsn := fmt.Sprintf(\"%s:%s@tcp(%s)/%s\", user, pass, host, name)",
        "new BasicAWSCredentials(accessKey, secretKey)",
        "Deployed AKIA key rotation at commit 3f9b2e71c4d8a05e6b1f27c9d4e8a013c58a9e21.",
        "EMAIL_HOST_PASSWORD = 'type your code here'\nzip -r -P \"$ZIP_PASSWORD\" backup.zip data/\nnet user bob * /add",
        "for name in (\"dfas\", \"keywords\", \"tokens\", \"symbol2label\"):\n    spec = ('OAUTH2_CLIENT_SECRET', 'oauth2ClientSecret')",
        "Each line of /etc/passwd reads account:password:UID:GID:GECOS:directory:shell.\nLogin: admin / password",
        "SECRET_KEY = os.environ.get(\"SECRET_KEY\", \"dev-secret-key-change-in-production\")\napiKey: azureADTokenProvider ?? apiKey,",
        "const token = jwt.sign(payload, process.env.JWT_SECRET);\necho $CR_PAT | docker login ghcr.io -u USERNAME --password-stdin",
        "\"sentry.op\": OP.QUEUE_SUBMIT_ARQ,\nrefreshToken: credential_factory_1.refreshToken,\nDeviceToken: NonEmptySensitiveString1600;",
        "HTTP/1.1 200 OK\nContent-Type: application/json\n\n{\"access_token\":\"2YotnFZFEjr1zCsicMWpAA\",\"token_type\":\"example\",\"refresh_token\":\"tGzv3JOkF0XG5Qx2TlKWIA\"}\nAuthorization: Basic czZCaGRSa3F0MzpnWDFmQmF0M2JW",
        "\"ARN\": \"arn:aws:secretsmanager:us-west-2:123456789012:secret:MyTestDatabaseSecret-a1b2c3\",",
        "authorization: \"https://oauth.yandex.ru/authorize?scope=login:info+login:email+login:avatar\",",
        "sqlplus / as sysdba\nsqlplus scott/tiger@orcl\nConnect client/server apps over TCP/IP.",
        "enable secret 5 $1$mERr$hx5rVt7rPNoS4wqbXKX7m0\nsnmp-server community public RO",
        "extra_args += [\"--password\", password]\nmc alias set local http://localhost:9000 minioadmin minioadmin",
        "echo \"$STRIPE_KEY\" | wrangler secret put STRIPE_KEY\nmsbuild App.sln /p:Configuration=Release",
        "new SymmetricSecurityKey(Encoding.UTF8.GetBytes(builder.Configuration[\"Jwt:Key\"]))\nvar jwtKey = []byte(os.Getenv(\"JWT_SECRET\"))",
        "def sign(self, private_key: PKCS7PrivateKeyTypes, data: bytes):\nX25519PrivateKey = rust_openssl.hpke.X25519PrivateKey",
        "κωδικός: απαιτείται για την είσοδο\nMật khẩu: phải có ít nhất tám ký tự\n密码是用户登录时必须提供的\nZugangsdaten: siehe Dokumentation",
        "consul acl token read -id 3e1b9c7d-2a4f-4d85-b6e0-9f7a1c5d2e38\nrootpw {SSHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\nrocommunity public default",
        "Your password has been reset to the default.\nI generated a key for you: run `openssl rand -hex 32` to make your own.",
        "pulumi config set aws:region eu-west-1\nrclone config create nas sftp host nas.corp.io user deploy\niwconfig wlan0 key off",
        "cache_key = \"0f2d565fd49881752b59097ec5736a3a20f24bc1\"\nkey: 'SomeComponentListItemKey'\nds.setPassword(System.getenv(\"DB_PASSWORD\"));",
        "otpauth://totp/Example:alice@fsf.org?secret=JBSWY3DPEHPK3PXP&issuer=Example\noauth_token=\"ad180jjd733klru7\"",
        "Use the token endpoint to exchange the code.\nLog in as root with sudo privileges.\nMap `src` / `dst` to the new names.",
        "The passphrase protects the private key on disk.\nSet `OPENAI_API_KEY` to `sk-...` in your shell.",
        "\"Sec-WebSocket-Key\": \"dGhlIHNhbXBsZSBub25jZQ==\",\nnew Redis(\"redis://:authpassword@127.0.0.1:6380/4\");\nsee vault/hvb.JGbZZaCkOSgsZ56uhGlTK2zyC1j2mwhy0VLp4",
        "sqlcmd -S localhost -U sa -P 'yourStrong(!)Password' -Q \"SELECT 1\"\n$ git push upstream -u stable/5.2.x:stable/5.2.x",
        "Set the `OPENAI_API_KEY` environment variable to your key.\nUsername and password: see the vault.\nЛогин и пароль: выдаёт администратор.\nДоступ к базе: только из VPN.\nПароль сброшен на стандартный.",
        "Pick the index of the context; the syntax is the same today and on Monday.\nLog in with GitHub and authorize the app.\nSign in with your email and password.",
        "private static final char[] HEX = \"0123456789abcdef\".toCharArray();\nks.load(in, password.toCharArray());\nPress your key (Ctrl+K) twice.",
        "Net::SMTP.start(ENV['SMTP_HOST'], 587, 'corp.io', 'mailer', ENV['SMTP_PASSWORD'], :login)\nDatadog API key: see the Organization Settings page.",
        // Libraries' documented examples: requests-oauthlib's OAuth 1 callback, python-jose's
        // JWT of `{"a":"b"}`, Twilio's abbreviated `private_key`, an LDAP hash in a test table.
        "redirect_response = 'https://127.0.0.1/callback?oauth_token=kjerht2309uf&oauth_token_secret=lsdajfh923874&oauth_verifier=w34o8967345'",
        "token = 'eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJhIjoiYiJ9.jiMyrsmD8AoHWeQgmxZ5yq8z0lXS67_QGs52AzC8Ru8'",
        "For example, `-----BEGIN RSA PRIVATE KEY----- MIIEpQIBAAKCAQEAuyf/lNrH9ck8DmNyo3fGgvCI1l9s+cmBY3WIz+cUDqmxiieR. -----END RSA PRIVATE KEY-----`",
        "(\"secret\", \"{SSHA}0H+zTv8o4MR4H43n03eCsvw1luG8LdB7\"),",
        "s3_key = \"uploads/2024/march/reports/summary/final\"\naws_key_sha1 = \"0f2d565fd49881752b59097ec5736a3a20f24bc1\"",
        "expect \"password:\"\nsend \"$password\\r\"\nexpect(screen.getByText(\"Password\")).toBeInTheDocument();",
        // Base64 of a number, but no token after it.
        "id: MTAzNDQ3MzU0OTc3NDAyNjc0OA==\nMTAzNDQ3MzU0OTc3NDAyNjc0OA.example.token",
    ] {
        let found = rules.scan(text);
        assert!(found.is_empty(), "{text:?}: {found:?}");
    }
}

/// Bare Discord tokens on consecutive lines: the byte that ends one match must not be
/// needed to begin the next, or every second token of a list would go out.
#[test]
fn bare_discord_tokens_on_consecutive_lines_all_block() {
    let rules = builtin();
    let tokens = [
        "MTAzNDQ3MzU0OTc3NDAyNjc0OA.iDaEeL.wgaCjYRwnpwOtAa1RVv6-hC0i_B6b2YUF4_Hfb",
        "MTEzODg4NDg0MTc5MTc0NTIxMg.iL86rW.AJcBCVaL45Q13jw4gWVDT8IQ8GhcwblDOJYGdq",
        "ODk1NDcyMzEwNjU4ODk2NTk2.YVt1aQ.kP3xN7mR2vB9qL5wT8yF0gH4jZq",
    ];
    let text = tokens.join("\n");
    let found = rules.scan(&text);
    for token in tokens {
        let at = text.find(token).unwrap_or(usize::MAX);
        assert!(
            found.iter().any(|f| f.start == at && f.end == at + token.len() && f.action == Action::Block),
            "{token}: {found:?}"
        );
    }
}
